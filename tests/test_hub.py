"""Models and datasets from the Hugging Face Hub: the real huggingface_hub client, driven by
kvbench, downloads from a stand-in of the hub's API on 127.0.0.1 (tests/plugins/hub_standin.py):
first use with progress, a pinned revision, a bad one, a gated repo with and without a token,
offline with and without the files cached; validate reads config.json alone; the commit is
recorded and a baseline of another commit is not compared."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kvbench.models import load_model
from kvbench.models.info import describe_model
from kvbench.report.markdown import render_markdown
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.checkpoints import checkpoint_files, save_checkpoint
from tests.plugins.cli_support import invoke
from tests.plugins.hub_standin import HubStandIn, point_kvbench_at

REPO = "kvb-test/tiny"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with HubStandIn() as standin:
        point_kvbench_at(standin, monkeypatch, tmp_path / "hf-cache")
        yield standin


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory):
    """The files of two commits of one tiny checkpoint (other weights, the same config)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return [checkpoint_files(save_checkpoint(root / f"c{seed}", seed=seed)) for seed in (0, 1)]


def _weights(loaded) -> torch.Tensor:
    return loaded.model.get_input_embeddings().weight.detach().clone()


def test_validate_reads_config_json_alone_and_resolves_the_commit(hub, two_commits):
    sha = hub.add_model(REPO, two_commits[0])
    info = describe_model(REPO)
    assert info.revision == sha
    assert hub.downloaded() == [f"{REPO}/config.json"]


def test_first_use_downloads_the_checkpoint_with_progress(hub, two_commits):
    hub.add_model(REPO, two_commits[0])
    said = []
    loaded = load_model(REPO, log=said.append)
    fetched = {path.rpartition("/")[2] for path in hub.downloaded()}
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "generation_config.json"} <= fetched
    assert any(text.startswith(f"downloading {REPO}") and " of " in text for text in said), said
    sha = describe_model(REPO).revision
    assert f"downloaded {REPO} (commit {sha[:12]}): 58" in said[-1], said  # 58x kB in all
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("a key and a value")) == \
        "a key and a value"
    # a second load reads the cache: no file is fetched again
    before = len(hub.downloaded())
    load_model(REPO, log=said.append)
    assert len(hub.downloaded()) == before


def test_a_pinned_revision_loads_that_commit(hub, two_commits):
    first = hub.add_model(REPO, two_commits[0], tag="v1")
    second = hub.add_model(REPO, two_commits[1])
    latest = _weights(load_model(REPO))
    assert torch.equal(_weights(load_model(f"{REPO}@{first}")), _weights(load_model(f"{REPO}@v1")))
    assert not torch.equal(_weights(load_model(f"{REPO}@v1")), latest)
    assert describe_model(f"{REPO}@v1").revision == first
    assert describe_model(REPO).revision == second
    assert describe_model(REPO, revision=first).revision == first  # a case's commit wins


def test_a_bad_revision_is_refused_naming_it(hub, two_commits):
    hub.add_model(REPO, two_commits[0])
    with pytest.raises(ValueError, match="no revision 'v9'"):
        describe_model(f"{REPO}@v9")


def test_an_unknown_repository_is_refused_naming_it(hub):
    with pytest.raises(ValueError, match=f"model {REPO}: no such repository"):
        describe_model(REPO)


def test_a_gated_model_needs_a_token_with_access(hub, two_commits, monkeypatch):
    hub.add_model(REPO, two_commits[0])
    hub.gate(REPO, "hf_granted")
    with pytest.raises(ValueError, match="gated on the hub: ask for access") as refused:
        describe_model(REPO)
    assert "HF_TOKEN" in str(refused.value) and "not granted" not in str(refused.value)
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(ValueError, match="the token set now is not granted access"):
        describe_model(REPO)
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    assert load_model(REPO).num_layers == 2


def test_offline_uses_the_cache_and_refuses_what_it_lacks(hub, two_commits, monkeypatch):
    sha = hub.add_model(REPO, two_commits[0])
    hub.add_model("kvb-test/other", two_commits[1])
    expected = _weights(load_model(REPO))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = len(hub.requests)
    assert torch.equal(_weights(load_model(REPO)), expected)
    assert describe_model(REPO).revision == sha
    assert len(hub.requests) == asked  # nothing asked of the hub
    with pytest.raises(ValueError, match="not in the local Hugging Face cache .* HF_HUB_OFFLINE"):
        describe_model("kvb-test/other")


def test_offline_a_model_whose_config_alone_is_cached_names_the_download(hub, two_commits,
                                                                         monkeypatch):
    hub.add_model(REPO, two_commits[0])
    describe_model(REPO)  # validate fetched config.json, not the weights
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=f"kvbench models download {REPO}"):
        load_model(REPO)


def test_models_download_fetches_ahead_of_a_run(hub, two_commits, monkeypatch):
    sha = hub.add_model(REPO, two_commits[0])
    result = invoke("models", "download", REPO)
    assert result.exit_code == 0, result.output
    assert f"at commit {sha}" in result.output and "downloading" in result.output
    refused = invoke("models", "download", "kvb-test/absent")
    assert refused.exit_code == 2 and "no such repository" in refused.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what a cluster's node without network then has
    assert load_model(REPO).num_layers == 2


SUITE = """\
kvbench: 1
name: hubbed
defaults: {{model: "{model}", device: cpu}}
methods:
  - name: identity
benchmarks:
  - kind: perplexity
    params: {{context: 32, continuation: 8, calibration: 0}}
"""


def _suite(tmp_path, model: str):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(model=model))
    return load_suite(path)


def test_a_suite_records_the_commit_and_the_gate_refuses_another(hub, two_commits, tmp_path):
    from kvbench.judge.gate import gate
    from kvbench.run.runner import run_suite

    first = hub.add_model(REPO, two_commits[0], tag="v1")
    second = hub.add_model(REPO, two_commits[1])
    runs = {}
    for model in (f"{REPO}@v1", REPO, f"{REPO}@{second}"):
        suite = _suite(tmp_path, model)
        assert [case.model_revision for case in suite.cases] == \
            [first if model.endswith("v1") else second]
        runs[model] = run_suite(suite, tmp_path / model.replace("/", "_")).result
    stored = json.loads((tmp_path / f"{REPO}@v1".replace("/", "_") / "results.json").read_text())
    assert stored["cases"][0]["model_revision"] == first
    assert f"model_revision={first[:12]}" in render_markdown(runs[f"{REPO}@v1"])
    report = gate(runs[REPO], runs[f"{REPO}@v1"])
    assert report.not_comparable_cases == ["perplexity/identity"]
    assert any(f"model_revision: '{first}' -> '{second}'" in reason for reason in report.reasons)
    # one commit, named by its branch or by its sha: the same model
    assert gate(runs[f"{REPO}@{second}"], runs[REPO]).not_comparable_cases == []


def test_validate_offline_refuses_a_model_never_downloaded(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SuiteError) as refused:
        _suite(tmp_path, REPO)
    assert any("not in the local Hugging Face cache" in issue.message
               for issue in refused.value.issues)


def test_a_hub_dataset_is_downloaded_and_read(hub, tmp_path):
    pytest.importorskip("datasets")
    from kvbench.data.records import Fields, read_records

    rows = [{"context": f"ctx {i}", "input": f"q {i}", "answers": [f"a {i}"]} for i in range(3)]
    card = ("---\nconfigs:\n- config_name: easy\n  data_files:\n  - split: test\n"
            "    path: easy/test.jsonl\n- config_name: hard\n  data_files:\n  - split: test\n"
            "    path: hard/test.jsonl\n---\n")
    hub.add_dataset("kvb-test/qa", {
        "README.md": card.encode(),
        "easy/test.jsonl": "\n".join(json.dumps(r) for r in rows).encode(),
        "hard/test.jsonl": json.dumps(rows[0]).encode()})
    records = read_records("hf:kvb-test/qa:easy:test", Fields("context", "input", "answers", None))
    assert [r.question for r in records] == ["q 0", "q 1", "q 2"]
    assert "datasets/kvb-test/qa/hard/test.jsonl" not in hub.downloaded()  # the config's files


def test_an_mlx_community_4bit_checkpoint_runs_on_mlx_and_is_refused_on_torch(hub, tmp_path):
    pytest.importorskip("mlx_lm")
    from mlx_lm import convert

    from kvbench.run.runner import run_suite

    source = save_checkpoint(tmp_path / "source", hidden_size=128, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, intermediate_size=256)
    convert(hf_path=str(source), mlx_path=str(tmp_path / "q4"), quantize=True, q_bits=4,
            q_group_size=32)
    sha = hub.add_model("mlx-community/tiny-4bit", checkpoint_files(tmp_path / "q4"))
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(model="mlx-community/tiny-4bit").replace(
        "device: cpu", "device: cpu, backend: mlx"))
    result = run_suite(load_suite(path), tmp_path / "out").result
    case = result.cases[0]
    assert case.status == "ok", case.error
    assert (case.model_revision, case.backend) == (sha, "mlx")
    assert case.metrics["ppl_rel_delta"].value == 0
    with pytest.raises(SuiteError, match="quantized by mlx-lm"):
        _suite(tmp_path, "mlx-community/tiny-4bit")


def test_kvbench_run_ruler_on_a_hub_model_from_the_command_line(hub, two_commits, tmp_path):
    """The issue's command end to end, as a user runs it: a pinned revision downloaded with
    progress, loaded in bf16, its commit in results.json; a run of another revision is refused
    by the gate (--strict: exit 4), naming both commits."""
    first = hub.add_model(REPO, two_commits[0], tag="v1")
    second = hub.add_model(REPO, two_commits[1])
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}

    def run(model: str, out: str, *more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kvbench.cli", "run", "ruler", "--model", model,
             "--dtype", "bfloat16", "--device", "cpu", "--set", "ruler.length=1024",
             "--set", "ruler.samples=2", "--only", "*niah_single_1*", "--methods", "identity",
             "--out", str(tmp_path / out), *more],
            env=env, capture_output=True, text=True, timeout=600)

    done = run(f"{REPO}@v1", "v1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"downloaded {REPO} (commit {first[:12]})" in done.stdout + done.stderr
    (case,) = json.loads((tmp_path / "v1" / "results.json").read_text())["cases"]
    assert (case["status"], case["model_revision"], case["model_dtype"]) == \
        ("ok", first, "bfloat16")
    refused = run(REPO, "main", "--baseline", str(tmp_path / "v1" / "results.json"), "--strict")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert f"model_revision: '{first}' -> '{second}'" in " ".join(refused.stderr.split())
    assert not (tmp_path / "main" / "results.json").exists()  # refused before any work
