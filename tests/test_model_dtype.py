"""`model_dtype`: a suite's torch model in float32 (the default), bfloat16 or float16, through the
runner, the records, the report and `kvbench serve`."""
from __future__ import annotations

import pytest

from kvbench.benchmarks.measure.kvbench_serve import kvbench_serve_command
from kvbench.report.markdown import render_markdown
from kvbench.results import fingerprint, load_results
from kvbench.run.runner import run_suite
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import invoke
from tests.plugins.suites import ROOT

SUITE = """\
kvbench: 1
name: dtype
defaults: {{model: "tiny:llama", device: cpu, repeats: 1{extra}}}
methods:
  - name: identity
  - name: intq
    params: {{bits: 4}}
benchmarks:
  - kind: perplexity
    params: {{context: 32, continuation: 8}}
"""


def _run(tmp_path, extra: str):
    folder = tmp_path / (extra.strip(", ") or "default").replace(": ", "-")
    folder.mkdir()
    (folder / "suite.yaml").write_text(SUITE.format(extra=extra))
    result = run_suite(load_suite(folder / "suite.yaml"), folder / "out").result
    assert [c.status for c in result.cases] == ["ok", "ok"], [c.error for c in result.cases]
    return {c.method_label: c for c in result.cases}, result


def test_a_bfloat16_model_halves_the_plain_cache_and_defines_other_cases(tmp_path):
    plain, _ = _run(tmp_path, "")
    half, result = _run(tmp_path, ", model_dtype: bfloat16")
    assert plain["identity"].model_dtype == "float32" and half["identity"].model_dtype == "bfloat16"
    # the cache stores what the model computes: 2 bytes a value instead of 4
    assert (half["identity"].metrics["kv_bytes"].value * 2
            == plain["identity"].metrics["kv_bytes"].value)
    # intq's codes do not depend on the model's dtype: the same bytes
    assert half["intq"].metrics["kv_bytes"].value == plain["intq"].metrics["kv_bytes"].value
    assert half["identity"].metrics["perplexity"].value != plain["identity"].metrics[
        "perplexity"].value
    assert half["identity"].fingerprint != plain["identity"].fingerprint
    assert "model_dtype=bfloat16" in render_markdown(result)
    assert "model_dtype=" not in render_markdown(_run(tmp_path, ", model_dtype: float32")[1])


def test_float32_records_keep_the_fingerprints_they_were_stored_with():
    """model_dtype is part of a case's definition only when it is not float32: every committed
    result (and baseline) made before it still matches its fingerprint."""
    cases = load_results(ROOT / "reports" / "quick" / "results.json").cases
    assert cases and all(fingerprint(case) == case.fingerprint for case in cases)


def test_mlx_refuses_a_model_dtype(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(extra=", backend: mlx, model_dtype: float16"))
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    assert any(issue.key == "defaults" and "model_dtype applies to torch" in issue.message
               for issue in caught.value.issues), caught.value.issues


def test_serve_loads_the_model_in_the_dtype_asked(monkeypatch):
    command = kvbench_serve_command("tiny:llama", "identity", "{}", 8000, "cuda", 4, "bfloat16")
    assert command[command.index("--model-dtype") + 1] == "bfloat16"

    seen = {}
    import kvbench.serve.server as server

    monkeypatch.setattr(server, "serve", lambda *args, **kwargs: seen.update(kwargs))
    result = invoke("serve", "--model", "tiny:llama", "--model-dtype", "float16")
    assert result.exit_code == 0, result.output
    assert seen["model_dtype"] == "float16"
    refused = invoke("serve", "--model-dtype", "float64")
    assert refused.exit_code == 2 and "float64" in refused.output


def test_the_results_page_names_the_model_dtype(tmp_path):
    from kvbench.report.html import build_site

    _, result = _run(tmp_path, ", model_dtype: float16")
    build_site([(str(tmp_path / "float16" / "out" / "results.json"), result)], tmp_path / "site")
    assert "tiny:llama (float16)" in (tmp_path / "site" / "index.html").read_text()


def test_a_suite_naming_no_dtype_hashes_as_before_model_dtype(tmp_path):
    """Runs started before model_dtype existed resume: a suite that names none of the model
    settings added since records none of them, so its hash is unchanged; a dtype it names is
    another suite (float32 too: auto is the checkpoint's own dtype on a GPU)."""
    from kvbench.suite.schema import LATER_SETTINGS

    hashes = {}
    for extra in ("", ", model_dtype: auto", ", model_dtype: float32", ", model_dtype: bfloat16"):
        path = tmp_path / "suite.yaml"
        path.write_text(SUITE.format(extra=extra))
        suite = load_suite(path)
        hashes[extra] = suite.hash
        named = set(LATER_SETTINGS) & set(suite.resolved["defaults"])
        assert named == ({"model_dtype"} if extra not in ("", ", model_dtype: auto") else set())
    assert hashes[""] == hashes[", model_dtype: auto"]
    assert len({hashes[""], hashes[", model_dtype: float32"],
                hashes[", model_dtype: bfloat16"]}) == 3
