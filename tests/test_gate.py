"""gate(): directions, tolerances, spreads of timed metrics, missing/new cases, comparability."""
from __future__ import annotations

from kvbench.gate import gate, tolerances_from_resolved
from kvbench.tolerance import DEFAULT_TOLERANCE
from kvbench.results import CaseResult, Metric, RunResult, SuiteRecord
from kvbench.tolerance import Tolerance

REL5 = Tolerance(rel=0.05)


def case(case_id: str = "proofs/m/x=1", status: str = "ok", comparable=None, **metrics) -> CaseResult:
    return CaseResult(
        id=case_id, benchmark=case_id.split("/")[0], bench_params={}, method="m", method_label="m",
        method_params={}, status=status, metrics=metrics, comparable=comparable or {},
    )


def run(*cases: CaseResult, key: str = "linux-x86_64-cpu", suite: str = "quick",
        schema: int | None = None) -> RunResult:
    result = RunResult(
        kvbench_version="0.1.0", git_sha="abc", machine={"key": key},
        suite=SuiteRecord(name=suite, path=f"suites/{suite}.yaml", hash="h", resolved={}),
        started="2025-01-01T00:00:00Z", cases=list(cases),
    )
    if schema is not None:
        result.schema_version = schema
    return result


def lower(value: float) -> Metric:
    return Metric(value=value, unit="", direction="lower")


def timed(*samples: float) -> Metric:
    return Metric.from_samples(list(samples), "ms", "lower")


def higher(value: float) -> Metric:
    return Metric(value=value, unit="", direction="higher")


def verdict(before: Metric, now: Metric, default=REL5, per_metric=None) -> str:
    report = gate(run(case(m=now)), run(case(m=before)), default, per_metric or {})
    (row,) = report.rows
    return row.verdict


def test_lower_is_better_directions():
    assert verdict(lower(1.0), lower(1.2)) == "regression"
    assert verdict(lower(1.0), lower(0.8)) == "improvement"
    assert verdict(lower(1.0), lower(1.04)) == "same"
    report = gate(run(case(m=lower(1.2))), run(case(m=lower(1.0))), REL5, {})
    assert [(r.baseline, r.current, round(r.ratio, 3)) for r in report.regressions] == [(1.0, 1.2, 1.2)]
    assert report.exit_code() == 1


def test_higher_is_better_directions():
    assert verdict(higher(1.0), higher(0.8)) == "regression"
    assert verdict(higher(1.0), higher(1.2)) == "improvement"
    assert verdict(higher(1.0), higher(0.96)) == "same"


def test_abs_rel_and_both_tolerances():
    assert verdict(lower(10.0), lower(10.3), Tolerance(abs=0.5)) == "same"
    assert verdict(lower(10.0), lower(10.6), Tolerance(abs=0.5)) == "regression"
    assert verdict(lower(10.0), lower(10.6), Tolerance(rel=0.1)) == "same"
    # Both: the larger slack applies.
    assert verdict(lower(10.0), lower(10.9), Tolerance(abs=1.0, rel=0.05)) == "same"
    assert verdict(lower(10.0), lower(11.1), Tolerance(abs=1.0, rel=0.05)) == "regression"


def test_per_metric_override_beats_default():
    per_metric = {"m": Tolerance(abs=0.001)}
    assert verdict(lower(1.0), lower(1.01), REL5) == "same"
    assert verdict(lower(1.0), lower(1.01), REL5, per_metric) == "regression"


def test_direction_none_is_shown_but_never_gated():
    report = gate(run(case(m=Metric(value=100.0))), run(case(m=Metric(value=1.0))), REL5, {})
    assert [r.verdict for r in report.rows] == ["not gated"]
    assert report.exit_code() == 0


def test_nan_in_current_is_a_regression():
    assert verdict(lower(1.0), lower(float("nan"))) == "regression"


def test_timed_metric_with_overlapping_spreads_is_not_significant():
    before = timed(10.0, 10.5, 11.0, 14.0)
    now = timed(12.0, 12.5, 13.0, 13.5)  # median +20%, but inside the baseline's spread
    assert verdict(before, now) == "not significant"


def test_timed_metric_with_separate_spreads_is_a_regression_or_improvement():
    before = timed(10.0, 10.2, 10.4, 10.6)
    slower = timed(12.0, 12.5, 13.0, 13.5)
    faster = timed(8.0, 8.1, 8.2, 8.3)
    assert verdict(before, slower) == "regression"
    assert verdict(before, faster) == "improvement"


def test_missing_case_counts_only_when_expect_all():
    baseline = run(case("a/m/x", m=lower(1)), case("b/m/x", m=lower(1)))
    current = run(case("a/m/x", m=lower(1)))
    strict = gate(current, baseline, REL5, {})
    assert strict.missing_cases == ["b/m/x"]
    assert strict.exit_code() == 1
    filtered = gate(current, baseline, REL5, {}, expect_all=False)
    assert filtered.missing_cases == ["b/m/x"]
    assert filtered.exit_code() == 0


def test_new_case_is_listed_and_not_gated():
    report = gate(run(case("a/m/x", m=lower(1)), case("n/m/x", m=lower(1))),
                  run(case("a/m/x", m=lower(1))), REL5, {})
    assert report.new_cases == ["n/m/x"]
    assert report.exit_code() == 0


def test_failed_case_in_current_run_is_listed_and_regresses():
    report = gate(run(case(status="error")), run(case(m=lower(1))), REL5, {})
    assert report.failed_cases == ["proofs/m/x=1"]
    assert report.exit_code() == 1


def test_case_comparable_mismatch_exits_4():
    report = gate(run(case(comparable={"tokens_sha256": "aaa"}, m=lower(2))),
                  run(case(comparable={"tokens_sha256": "bbb"}, m=lower(1))), REL5, {})
    assert report.not_comparable_cases == ["proofs/m/x=1"]
    assert any("tokens_sha256" in r and "proofs/m/x=1" in r for r in report.reasons)
    assert [r.verdict for r in report.rows] == ["not comparable"]
    assert report.exit_code() == 4


def test_machine_key_mismatch_exits_4():
    report = gate(run(case(m=lower(1)), key="darwin-arm64-apple-mps"),
                  run(case(m=lower(1))), REL5, {})
    assert not report.comparable
    assert any("machine key" in r for r in report.reasons)
    assert report.exit_code() == 4


def test_schema_version_and_suite_name_mismatch_exit_4():
    by_schema = gate(run(case(m=lower(1)), schema=2), run(case(m=lower(1))), REL5, {})
    assert any("schema_version" in r for r in by_schema.reasons)
    assert by_schema.exit_code() == 4
    by_suite = gate(run(case(m=lower(1)), suite="other"), run(case(m=lower(1))), REL5, {})
    assert by_suite.exit_code() == 4


def test_tolerances_from_resolved():
    default, per_metric = tolerances_from_resolved({})
    assert default == DEFAULT_TOLERANCE and per_metric == {}
    default, per_metric = tolerances_from_resolved(
        {"gate": {"default": {"rel": 0.1}, "metrics": {"perplexity": {"abs": 0.01}}}}
    )
    assert default == Tolerance(rel=0.1)
    assert per_metric == {"perplexity": Tolerance(abs=0.01)}
