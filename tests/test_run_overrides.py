"""Any suite on any model from the command line (issue 65): --model, --dtype, --device and --set
reach the cases and the results, a bad flag is refused naming it, --set replaces a matrix axis,
an include names a shipped suite, a claim calibrated on one model is skipped on another, every
shipped torch suite validates on a tiny model, and --resume keeps the flags."""
from __future__ import annotations

import json
import shlex
import signal

import pytest
import yaml

from kvbench.judge.claims import judge
from kvbench.results import Metric
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from kvbench.suite.locate import shipped_suites
from kvbench.suite.overrides import parse_set
from tests.plugins.cli_support import (  # noqa: F401
    invoke, kvbench_process, logged, wait_until, wide_consoles,
)
from tests.plugins.extras import needs
from tests.plugins.kvb_testplugin import BLOCK_AT
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S

CALIBRATED = "calibrated on bundled:smollm2-135m; this case runs tiny:llama"

SUITE = """\
kvbench: 1
name: overrides
defaults: {model: bundled:smollm2-135m, device: auto, repeats: 1}
methods:
  - name: identity
benchmarks:
  - kind: perplexity
    params: {continuation: 8}
    matrix: {context: [32, 48]}
    claims:
      - {cases: "perplexity/identity/*", claim: "ppl_rel_delta <= 0.0001"}
      - {cases: "perplexity/identity/*", claim: "ppl_rel_delta >= -0.0001",
         model: bundled:smollm2-135m}
      # scoped to a value --set replaces: it then applies to no case (not an error)
      - {cases: "perplexity/identity/context=32", claim: "ppl_rel_delta <= 0.001"}
"""


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text(SUITE)
    return path


@needs("torch")
def test_the_flags_reach_the_cases_and_the_results_record_them(suite, tmp_path):
    flags = ["--model", "tiny:llama", "--dtype", "float32", "--device", "cpu",
             "--set", "perplexity.context=40", "--set", "defaults.seed=7"]
    result = invoke("run", suite, "--out", tmp_path / "out", *flags)
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "out" / "results.json").read_text())
    # the matrix axis is the one value --set gave: one case, its id naming it
    [case] = run["cases"]
    assert case["id"] == "perplexity/identity/context=40"
    assert (case["model"], case["model_dtype"], case["device"], case["seed"]) == (
        "tiny:llama", "float32", "cpu", 7)
    assert case["bench_params"]["context"] == 40
    assert run["suite"]["resolved"]["defaults"]["model"] == "tiny:llama"
    settings = run["settings"]
    assert (settings["model"], settings["model_dtype"], settings["device"]) == (
        "tiny:llama", "float32", "cpu")
    assert settings["set"] == ["perplexity.context=40", "defaults.seed=7"]
    # the claim calibrated on the bundled model is skipped with its reason, the other judged
    verdicts = {claim["claim"]: (claim["verdict"], claim["measured_as"])
                for claim in case["claims"]}
    assert verdicts == {"ppl_rel_delta <= 0.0001": ("held", None),
                        "ppl_rel_delta >= -0.0001": ("skipped", CALIBRATED)}
    assert "claims held 1/1, failed 0, skipped 1 (calibrated on another model" in result.output
    assert "claims 1/1, 1 skipped" in result.output  # the case's line counts what it judged
    assert f"skipped: {CALIBRATED}" in result.output
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"| ⏭ skipped: {CALIBRATED} |" in report
    assert "claims: 1 held, 1 skipped" in report
    page = invoke("report", tmp_path / "out" / "results.json", "--format", "html", "--out",
                  tmp_path / "site")
    assert page.exit_code == 0, page.output
    html = (tmp_path / "site" / "index.html").read_text()
    assert f"<span class='verdict skipped'>skipped</span><span class='why'>: {CALIBRATED}" \
        in html


@pytest.mark.parametrize("flags, message", [
    (["--set", "perplexity.contxt=4"],
     "--set perplexity.contxt=4: unknown key 'contxt'; did you mean 'context'"),
    (["--set", "ruler.length=4"],
     "--set ruler.length=4: the suite has no benchmark 'ruler'; its benchmarks: perplexity"),
    (["--set", "defaults.max_contxt=4"],
     "--set defaults.max_contxt=4: unknown key 'max_contxt'; did you mean 'max_context'"),
    (["--set", "defaults.max_context=abc"],
     "--set defaults.max_context=abc: must be a valid integer, got text 'abc'"),
    (["--set", "perplexity.continuation=1"],
     "--set perplexity.continuation=1: continuation must be >= 2, got 1"),
    (["--set", "perplexity.context"], "--set perplexity.context: expected KEY=VALUE"),
    (["--set", "perplexity.context=[1"], "--set perplexity.context=[1: the value is not YAML"),
    (["--model", "tiny:lama"], "--model: unknown tiny model 'tiny:lama'"),
    (["--dtype", "float8"], "Invalid value for '--dtype'"),
    # a length past the model's context: the flag's value, refused as an error (not a refusal
    # of the cases, as a setting the suite wrote for another model is)
    (["--model", "tiny:llama", "--set", "perplexity.context=5000"],
     "--set perplexity.context=5000: context + continuation = 5000 + 8 = 5008 tokens is above"
     " the 4096 that model tiny:llama is good for"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_bad_flag_is_refused_before_any_work_naming_it(suite, tmp_path, command, flags,
                                                         message):
    out = ["--out", tmp_path / "out"] if command == "run" else []
    result = invoke(command, suite, *out, *flags)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_validate_takes_the_flags_and_checks_the_suite_with_them(suite):
    result = invoke("validate", suite, "--model", "tiny:llama", "--set", "perplexity.context=40",
                    "--set", "perplexity.windows=2")
    assert result.exit_code == 0, result.output
    assert "valid: overrides: 1 case(s)" in result.output  # the suite as written makes 2
    assert "valid: overrides: 2 case(s)" in invoke("validate", suite).output


def test_set_replaces_a_matrix_axis_on_every_entry_of_its_kind(suite):
    loaded = load_suite(suite, [parse_set("perplexity.context=64"),
                                parse_set("perplexity.windows=3")])
    assert [case.id for case in loaded.cases] == ["perplexity/identity/context=64"]
    assert [(case.params.context, case.params.windows) for case in loaded.cases] == [(64, 3)]
    # RULER's entries per length (1024 for every method, 2048 and 4096 for some) become one:
    # each case runs once, not refused as made twice
    ruler = load_suite(shipped_suites()["ruler"], [parse_set("ruler.length=2048")],
                       model="tiny:qwen3")
    written = load_suite(shipped_suites()["ruler"], model="tiny:qwen3")
    ids = [case.id for case in ruler.cases]
    assert len(ids) == len(set(ids))
    assert {case.params.length for case in ruler.cases} == {2048}
    first_entry = {case.id.replace("length=1024", "length=2048") for case in written.cases
                   if "length=1024" in case.id}
    assert set(ids) == first_entry


def test_an_include_names_a_shipped_suite_and_a_file_there_wins(tmp_path):
    for name in ("quick", "seeds/turboquant"):
        (tmp_path / "mine.yaml").write_text(f"kvbench: 1\nname: mine\ninclude: [{name}]\n")
        mine = load_suite(tmp_path / "mine.yaml")
        shipped = load_suite(shipped_suites()[name])
        assert [case.id for case in mine.cases] == [case.id for case in shipped.cases]
        assert mine.resolved["methods"] == shipped.resolved["methods"]
    # a file of that name beside the suite is what it includes
    (tmp_path / "quick").write_text(
        "kvbench: 1\nmethods: [{name: identity}]\n"
        "benchmarks: [{kind: proofs, params: {n_vectors: 8, dim: 8}}]\n")
    (tmp_path / "beside.yaml").write_text("kvbench: 1\ninclude: [quick]\n")
    assert [case.id for case in load_suite(tmp_path / "beside.yaml").cases] == [
        "proofs/identity"]
    (tmp_path / "missing.yaml").write_text("kvbench: 1\ninclude: [quik]\n")
    with pytest.raises(SuiteError) as caught:
        load_suite(tmp_path / "missing.yaml")
    [issue] = caught.value.issues
    assert issue.key == "include[0]"
    assert "nor a shipped suite named 'quik'" in issue.message
    assert "did you mean quick?" in issue.message
    assert "the shipped suites: " in issue.message and "seeds/turboquant" in issue.message


def test_a_claim_calibrated_on_the_bundled_model_is_skipped_on_another_and_judged_on_it():
    quick = shipped_suites()["quick"]
    target = "perplexity/intq-bits4"
    [on_bundled] = [c for c in load_suite(quick).cases if c.id == target]
    [on_tiny] = [c for c in load_suite(quick, model="tiny:llama").cases if c.id == target]
    [bundled_claim] = on_bundled.claims
    [tiny_claim] = on_tiny.claims
    assert bundled_claim.model == tiny_claim.model == "bundled:smollm2-135m"
    assert bundled_claim.skipped is None
    assert tiny_claim.skipped == CALIBRATED
    metrics = {"ppl_rel_delta": Metric(value=0.5)}  # past its 0.12: judged, it fails
    assert judge(bundled_claim, metrics).verdict == "failed"
    skipped = judge(tiny_claim, metrics)
    assert (skipped.verdict, skipped.measured, skipped.measured_as) == (
        "skipped", None, CALIBRATED)
    # identity's exactness is claimed on any model
    [identity] = [c for c in load_suite(quick, model="tiny:llama").cases
                  if c.id == "perplexity/identity"]
    assert [claim.skipped for claim in identity.claims] == [None, None]


def test_a_suite_setting_a_swapped_model_cannot_hold_refuses_its_cases(tmp_path):
    quick = load_suite(shipped_suites()["quick"], model="tiny:llama")
    refused = {case.id: (case.refused_as, case.refused) for case in quick.cases if case.refused}
    assert set(refused) == {f"proofs/{label}/data=captured"
                            for label in ("identity", "intq-bits8", "intq-bits4", "intq-bits2")}
    assert {kind for kind, _ in refused.values()} == {"SettingUnfit"}
    assert "layers [15, 29] are not layers of tiny:llama, which has 2" in next(
        iter(refused.values()))[1]
    # the same layers on the suite's own model: the suite's error, at its line
    (tmp_path / "own.yaml").write_text(
        "kvbench: 1\ndefaults: {model: tiny:llama}\nmethods: [{name: identity}]\n"
        "benchmarks:\n  - kind: proofs\n"
        "    params: {data: captured, layers: [0, 15], tokens: 64}\n")
    with pytest.raises(SuiteError) as caught:
        load_suite(tmp_path / "own.yaml")
    [issue] = caught.value.issues
    assert (issue.line, issue.key) == (6, "benchmarks[0].params.layers")
    assert "layers [15] are not layers of tiny:llama" in issue.message


TORCH_SUITES = [name for name, path in shipped_suites().items()
                if not name.startswith("data/")
                and (yaml.safe_load(path.read_text()).get("defaults") or {}).get("backend")
                != "mlx"]


@pytest.mark.parametrize("model", ["tiny:llama", "tiny:qwen3"])
@pytest.mark.parametrize("name", TORCH_SUITES)
def test_every_shipped_torch_suite_validates_on_a_tiny_model(name, model):
    loaded = load_suite(shipped_suites()[name], model=model)
    # the suite's model is swapped (the architectures suites name one per benchmark: theirs)
    swapped = [case for case in loaded.cases if case.model == model]
    assert swapped and (len(swapped) == len(loaded.cases) or name.startswith("architectures"))


STEPS = ROOT / "tests" / "suites" / "cli" / "steps.yaml"  # five cases, each logs its index
STEP = "tests.plugins.kvb_testplugin:Step"


@needs("torch")
def test_an_interrupted_run_resumes_with_its_flags_and_refuses_others(tmp_path):
    out, log = tmp_path / "out", tmp_path / "cases.log"
    flags = ["--model", "tiny:llama", "--dtype", "float32", "--set", "defaults.seed=5",
             "--set", f"{STEP}.sleep_s=0.001"]
    proc = kvbench_process(["run", STEPS, "--out", out, *flags], tmp_path, **{BLOCK_AT: "2"})
    wait_until(lambda: logged(log) == [0, 1, 2], proc, "case 2 started", timeout=HANG_S)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, output
    hint = output.partition("Continue with:\n")[2].splitlines()[0].strip()
    assert hint == shlex.join(["kvbench", "run", str(STEPS), "--out", str(out), *flags,
                               "--resume"])
    # without the flags, the run is not continued: it was another model and seed
    refused = invoke("run", STEPS, "--out", out, "--resume")
    assert refused.exit_code == 2
    assert "model 'tiny:llama' then, not set now" in refused.output
    proc = kvbench_process(shlex.split(hint)[1:], tmp_path)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, output
    assert logged(log) == [0, 1, 2, 2, 3, 4]  # 0 and 1 kept, never run again
    run = json.loads((out / "results.json").read_text())
    assert run["settings"]["model"] == "tiny:llama"
    assert run["settings"]["set"] == ["defaults.seed=5", f"{STEP}.sleep_s=0.001"]
    assert [(case["info"]["seed"], case["bench_params"]["sleep_s"]) for case in run["cases"]] \
        == [(5, 0.001)] * 5
