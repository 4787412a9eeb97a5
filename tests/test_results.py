"""Results files: every value survives the round trip (NaN and infinities included), older
schemas are read, and non-finite measurements fail their claims."""
from __future__ import annotations

import json
import math

import pytest

from kvbench.judge.gate import gate
from kvbench.results import (
    SCHEMA_VERSION, CaseResult, Metric, ResultsFileError, defining_parts, fingerprint,
    load_results,
)
from tests.plugins.cli_support import invoke, wide_consoles  # noqa: F401
from tests.plugins.extras import require_extra
from tests.plugins.suites import DATA, ROOT, SMALL_RESULTS

NON_FINITE = ROOT / "tests" / "suites" / "cli" / "non_finite.yaml"
SCHEMA_1 = DATA / "results_schema1.json"  # written by hand in schema 1; kept as it was
EXPECTED = {"finite": 1.5, "nan": math.nan, "inf": math.inf, "neg_inf": -math.inf}


def _refuse_constants(name: str):
    raise AssertionError(f"bare JSON constant {name}: not valid JSON for strict readers")


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.fixture(scope="module")
def non_finite_run(tmp_path_factory):
    require_extra("torch")  # a run of the test benchmark
    out = tmp_path_factory.mktemp("nf") / "out"
    result = invoke("run", NON_FINITE, "--out", out)
    return out, result


def test_non_finite_metrics_are_written_as_strings_and_read_back_exactly(non_finite_run):
    out, _ = non_finite_run
    for name in ("results.json", "results.jsonl"):
        text = (out / name).read_text()
        for line in ([text] if name.endswith(".json") else text.splitlines()):
            json.loads(line, parse_constant=_refuse_constants)  # strict JSON everywhere
    raw = json.loads((out / "results.json").read_text())["cases"][0]["metrics"]
    assert [raw[n]["value"] for n in ("nan", "inf", "neg_inf")] == ["NaN", "Infinity", "-Infinity"]
    for path in (out / "results.json", out / "results.jsonl"):
        (case,) = load_results(path).cases
        got = {name: metric.value for name, metric in case.metrics.items()}
        assert got.keys() == EXPECTED.keys()
        assert all(same_float(got[n], EXPECTED[n]) for n in EXPECTED), got
        assert math.isnan(case.claims[1].measured)


def test_non_finite_metrics_fail_their_claims_and_mark_the_case(non_finite_run):
    out, result = non_finite_run
    assert result.exit_code == 1  # failed claims, not a crash
    (case,) = load_results(out / "results.json").cases
    assert case.status == "ok"
    assert [(c.claim, c.verdict) for c in case.claims] == [
        ("finite <= 2", "held"), ("nan <= 1", "failed"),
        ("inf >= 1", "failed"),  # inf >= 1 is true of the number; a diverged run holds nothing
        ("neg_inf <= 0", "failed"),
    ]
    assert case.warnings == [f"metric {n} is {EXPECTED[n]} (not finite): its claims fail"
                             for n in ("nan", "inf", "neg_inf")]
    assert "metric nan is nan (not finite)" in result.output
    report = (out / "report.md").read_text()
    assert "## Warnings" in report and "metric inf is inf (not finite)" in report


def test_reports_baselines_and_resume_work_on_non_finite_results(non_finite_run, tmp_path):
    out, _ = non_finite_run
    assert invoke("report", out / "results.json").exit_code == 0
    assert invoke("compare", out / "results.json", out / "results.json").exit_code == 0
    baseline = tmp_path / "baseline.json"
    assert invoke("baseline", "save", out / "results.json", "--to", baseline).exit_code == 0
    report = gate(load_results(out / "results.json"), load_results(baseline))
    verdicts = {row.metric: (row.verdict, row.rule) for row in report.rows}
    assert verdicts["finite"] == ("same", "tolerance: within rel 0.05")
    assert verdicts["nan"] == ("not gated", "the baseline value is not finite")
    resumed = invoke("run", NON_FINITE, "--out", out, "--resume")
    assert "resuming: 1 finished case(s) kept, 0 to run" in resumed.output


def test_schema_1_files_are_read_with_null_as_nan(tmp_path):
    old = json.loads(SCHEMA_1.read_text())
    assert old["schema_version"] == 1
    old["cases"][0]["metrics"]["mse"]["value"] = None  # how schema 1 wrote a NaN
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    result = load_results(path)
    assert result.schema_version == 1 and math.isnan(result.cases[0].metrics["mse"].value)
    assert result.cases[0].fingerprint == ""


def test_the_golden_results_file_is_a_current_run():
    """results_small.json is remade by running tests/data/small.yaml (tests/data/README.md): a
    file of an older schema, or of another suite, is stale."""
    small = load_results(SMALL_RESULTS)
    assert small.schema_version == SCHEMA_VERSION
    assert (small.suite.name, small.suite.path) == ("small", "tests/data/small.yaml")
    assert all(case.fingerprint == fingerprint(case) for case in small.cases)


def test_fingerprint_covers_what_defines_a_case_and_nothing_else():
    base = CaseResult(id="perplexity/q", benchmark="perplexity", bench_params={"context": 64},
                      method="intq", method_label="q", method_params={"bits": 4},
                      model="tiny:llama", status="ok", comparable={"tokens_sha256": "abc"})
    same = base.model_copy(update={"metrics": {"x": Metric(value=1.0)}, "duration_s": 9.0,
                                   "device": "cuda:0", "started": "later", "seed": 0})
    assert fingerprint(same) == fingerprint(base)  # measurements and clocks are not definition
    for change in ({"method_params": {"bits": 8}}, {"bench_params": {"context": 65}},
                   {"method": "kivi"}, {"benchmark": "quality"}, {"backend": "mlx"},
                   {"model": "bundled:smollm2-135m"}, {"threads": 1},
                   {"comparable": {"tokens_sha256": "abd"}}):
        assert fingerprint(base.model_copy(update=change)) != fingerprint(base), change
    assert set(defining_parts(base)) == {"schema_version", "benchmark", "bench_params", "method",
                                         "method_params", "backend", "model", "threads", "data"}


def test_a_case_reading_a_file_is_the_same_case_in_another_checkout():
    def reading(root: str) -> CaseResult:
        return CaseResult(id="perplexity/identity", benchmark="perplexity",
                          bench_params={"text": f"{root}/suites/texts/essay.txt"},
                          method="identity", method_label="identity", method_params={},
                          model=f"{root}/checkpoints/tiny", status="ok",
                          comparable={"tokens_sha256": "abc", "model": f"{root}/checkpoints/tiny"})

    here, there = reading("/home/me/kvbench"), reading("/home/runner/work/kvbench")
    assert fingerprint(here) == fingerprint(there)
    assert defining_parts(here)["bench_params"] == {"text": ".../essay.txt"}
    other_text = here.model_copy(update={"bench_params": {"text": "/home/me/kvbench/other.txt"}})
    assert fingerprint(other_text) != fingerprint(here)


def test_a_jsonl_without_header_or_with_a_bad_line_is_a_clear_error(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("")
    with pytest.raises(ResultsFileError, match="no header line"):
        load_results(path)
    path.write_text('{"type": "header"}\nnot json\n')
    with pytest.raises(ResultsFileError, match=r"results.jsonl:2: not a kvbench record"):
        load_results(path)


@pytest.mark.parametrize("text", ["cosine >= nan", "ppl <= inf", "x > -inf"])
def test_a_claim_on_a_non_finite_target_is_refused(text):
    from kvbench.judge.claims import parse_claim

    with pytest.raises(ValueError, match="the target must be a finite number"):
        parse_claim(text)
