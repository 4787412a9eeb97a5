"""gate(): directions, tolerances, the rules for timings, missing/new cases, comparability."""
from __future__ import annotations

import math

import pytest

from kvbench.judge.gate import SIGNIFICANCE, GatePolicy, gate
from kvbench.results import CaseResult, Metric, RunResult, SuiteRecord, fingerprint
from kvbench.judge.significance import shift_p_value, smallest_p_value
from kvbench.judge.tolerance import DEFAULT_TOLERANCE, Tolerance

REL5 = GatePolicy(Tolerance(rel=0.05))


def case(case_id: str = "proofs/m/x=1", status: str = "ok", comparable=None,
         method_params=None, **metrics) -> CaseResult:
    record = CaseResult(
        id=case_id, benchmark=case_id.split("/")[0], bench_params={}, method="m", method_label="m",
        method_params=method_params or {}, status=status, metrics=metrics,
        comparable=comparable or {},
    )
    record.fingerprint = fingerprint(record)
    return record


def run(*cases: CaseResult, key: str = "linux-x86_64-cpu", suite: str = "quick",
        schema: int | None = None, gate_block: dict | None = None) -> RunResult:
    result = RunResult(
        kvbench_version="0.1.0", git_sha="abc", machine={"key": key},
        suite=SuiteRecord(name=suite, path=f"suites/{suite}.yaml", hash="h",
                          resolved={"gate": gate_block} if gate_block else {}),
        started="2025-01-01T00:00:00Z", cases=list(cases),
    )
    if schema is not None:
        result.schema_version = schema
    return result


def lower(value: float) -> Metric:
    return Metric(value=value, unit="", direction="lower")


def higher(value: float) -> Metric:
    return Metric(value=value, unit="", direction="higher")


def ratio(*samples: float) -> Metric:
    return Metric.from_samples(list(samples), "x", "higher", timing="ratio")


def absolute(*samples: float) -> Metric:
    return Metric.from_samples(list(samples), "ms", "lower", timing="absolute")


def judged(before: Metric, now: Metric, policy=REL5) -> tuple[str, str]:
    report = gate(run(case(m=now)), run(case(m=before)), [policy])
    (row,) = report.rows
    return row.verdict, row.rule


def verdict(before: Metric, now: Metric, policy=REL5) -> str:
    return judged(before, now, policy)[0]


# ---------------------------------------------------------------- deterministic metrics


def test_lower_is_better_directions():
    assert verdict(lower(1.0), lower(1.2)) == "regression"
    assert verdict(lower(1.0), lower(0.8)) == "improvement"
    assert verdict(lower(1.0), lower(1.04)) == "same"
    report = gate(run(case(m=lower(1.2))), run(case(m=lower(1.0))), [REL5])
    assert [(r.baseline, r.current, round(r.ratio, 3)) for r in report.regressions] == [(1.0, 1.2, 1.2)]
    assert report.regressions[0].rule == "tolerance: beyond rel 0.05"
    assert report.exit_code() == 1


def test_higher_is_better_directions():
    assert verdict(higher(1.0), higher(0.8)) == "regression"
    assert verdict(higher(1.0), higher(1.2)) == "improvement"
    assert judged(higher(1.0), higher(0.96)) == ("same", "tolerance: within rel 0.05")


def test_abs_rel_and_both_tolerances():
    assert verdict(lower(10.0), lower(10.3), GatePolicy(Tolerance(abs=0.5))) == "same"
    assert verdict(lower(10.0), lower(10.6), GatePolicy(Tolerance(abs=0.5))) == "regression"
    assert verdict(lower(10.0), lower(10.6), GatePolicy(Tolerance(rel=0.1))) == "same"
    # Both: the larger slack applies.
    both = GatePolicy(Tolerance(abs=1.0, rel=0.05))
    assert verdict(lower(10.0), lower(10.9), both) == "same"
    assert verdict(lower(10.0), lower(11.1), both) == "regression"


def test_per_metric_override_beats_default():
    policy = GatePolicy(Tolerance(rel=0.05), {"m": Tolerance(abs=0.001)})
    assert verdict(lower(1.0), lower(1.01)) == "same"
    assert verdict(lower(1.0), lower(1.01), policy) == "regression"


def test_direction_none_is_shown_but_never_gated():
    report = gate(run(case(m=Metric(value=100.0))), run(case(m=Metric(value=1.0))), [REL5])
    assert [(r.verdict, r.rule) for r in report.rows] == [("not gated", "no better direction")]
    assert report.exit_code() == 0


def test_non_finite_current_is_a_regression_and_a_non_finite_baseline_is_not_gated():
    for bad in (math.nan, math.inf, -math.inf):
        assert verdict(lower(1.0), lower(bad)) == "regression"
        assert verdict(lower(bad), lower(1.0)) == "not gated"


# ---------------------------------------------------------------- the stricter suite decides


def test_each_metric_gets_the_stricter_of_both_suites_tolerances():
    loose = {"default": {"rel": 0.5}}
    strict = {"default": {"rel": 0.05}}
    before, now = case(m=lower(1.0)), case(m=lower(1.2))
    # The current suite cannot loosen the gate the baseline's suite set ...
    report = gate(run(now, gate_block=loose), run(before, gate_block=strict))
    assert [r.verdict for r in report.rows] == ["regression"]
    # ... and a current suite that is stricter applies too.
    report = gate(run(now, gate_block=strict), run(before, gate_block=loose))
    assert [r.verdict for r in report.rows] == ["regression"]
    report = gate(run(now, gate_block=loose), run(before, gate_block=loose))
    assert [r.verdict for r in report.rows] == ["same"]


def test_policy_from_the_stored_suite():
    assert GatePolicy.from_resolved({}) == GatePolicy(DEFAULT_TOLERANCE, {}, False)
    policy = GatePolicy.from_resolved({"gate": {
        "default": {"rel": 0.1, "abs": None}, "metrics": {"perplexity": {"abs": 0.01}},
        "absolute_timings": True}})
    assert policy == GatePolicy(Tolerance(rel=0.1), {"perplexity": Tolerance(abs=0.01)}, True)
    assert policy.tolerance("perplexity") == Tolerance(abs=0.01)
    assert policy.tolerance("mse") == Tolerance(rel=0.1)


# ---------------------------------------------------------------- timings


def test_same_run_ratio_needs_tolerance_and_significance():
    before = ratio(1.00, 1.02, 0.98, 1.01, 0.99)
    # Moved by half, every sample below every baseline sample: p = 1/252.
    slower = ratio(0.50, 0.52, 0.48, 0.51, 0.49)
    assert judged(before, slower)[0] == "regression"
    assert judged(before, slower)[1] == ("same-run ratio: beyond rel 0.05 and Mann-Whitney "
                                         "p = 0.004")
    assert verdict(before, ratio(1.50, 1.52, 1.48, 1.51, 1.49)) == "improvement"
    # Median moved beyond tolerance, but the samples overlap: noise, not a change.
    noisy = ratio(0.5, 1.03, 0.6, 1.04, 0.7)
    result, rule = judged(before, noisy)
    assert result == "not significant" and rule.startswith("same-run ratio: beyond rel 0.05, "
                                                           "Mann-Whitney p = ")
    assert judged(before, ratio(0.99, 1.0, 1.01, 0.98, 1.02))[0] == "same"


def test_too_few_samples_can_never_be_significant():
    # 3 and 3 samples: the smallest one-sided p is 1/20, above the level.
    result, rule = judged(ratio(1.0, 1.0, 1.0), ratio(0.1, 0.1, 0.1))
    assert result == "not significant"
    assert rule == f"same-run ratio: beyond rel 0.05, but 3 and 3 samples cannot reach p < {SIGNIFICANCE:g}"


def test_absolute_timings_are_not_gated_unless_the_suite_asks():
    before, now = absolute(1.0, 1.0, 1.1, 0.9, 1.0), absolute(4.0, 4.2, 4.1, 3.9, 4.0)
    result, rule = judged(before, now)
    assert result == "not gated" and rule.startswith("absolute timing: gated through its same-run")
    asked = GatePolicy(Tolerance(rel=0.05), {}, absolute_timings=True)
    result, rule = judged(before, now, asked)
    assert result == "regression" and rule.startswith("absolute timing: beyond rel 0.05 and "
                                                      "Mann-Whitney")
    # Asked for, but not significant: a single slow sample among fast ones does not count.
    assert verdict(before, absolute(1.0, 4.0, 4.0, 0.9, 1.1), asked) == "not significant"


def test_mann_whitney_p_values():
    assert shift_p_value([1, 2, 3], [4, 5, 6], larger=True) == pytest.approx(1 / 20)
    assert shift_p_value([1, 2, 3], [4, 5, 6], larger=False) == 1.0
    assert smallest_p_value(5, 5) == pytest.approx(1 / 252)
    # Interleaved samples: no evidence either way.
    assert shift_p_value([1, 3, 5, 7], [2, 4, 6, 8], larger=True) > 0.2
    # All ties: nothing moved.
    assert shift_p_value([2.0] * 6, [2.0] * 6, larger=True) > 0.5
    # The exact and the normal approximation agree where they meet.
    import kvbench.judge.significance as significance

    a = [float(i) for i in range(0, 100, 2)]
    b = [float(i) + 7 for i in range(0, 100, 2)]
    exact = significance.shift_p_value(a, b, larger=True)
    significance_exact, significance.EXACT_PAIRS = significance.EXACT_PAIRS, 0
    try:
        assert significance.shift_p_value(a, b, larger=True) == pytest.approx(exact, abs=2e-3)
    finally:
        significance.EXACT_PAIRS = significance_exact


# ---------------------------------------------------------------- cases


def test_missing_case_counts_only_when_expect_all():
    baseline = run(case("a/m/x", m=lower(1)), case("b/m/x", m=lower(1)))
    current = run(case("a/m/x", m=lower(1)))
    strict = gate(current, baseline, [REL5])
    assert strict.missing_cases == ["b/m/x"]
    assert strict.exit_code() == 1
    filtered = gate(current, baseline, [REL5], expect_all=False)
    assert filtered.missing_cases == ["b/m/x"]
    assert filtered.exit_code() == 0


def test_a_run_that_recorded_its_filters_is_judged_as_a_subset_by_default():
    """run --baseline and a later compare --gate of its file decide alike: from the file."""
    baseline = run(case("a/m/x", m=lower(1)), case("b/m/x", m=lower(1)))
    current = run(case("a/m/x", m=lower(1)))
    current.selection = {"only": "a/*"}
    assert gate(current, baseline, [REL5]).exit_code() == 0
    current.selection = {}
    current.settings = {"shard": "1/2"}
    assert gate(current, baseline, [REL5]).exit_code() == 0
    current.settings = {}
    assert gate(current, baseline, [REL5]).exit_code() == 1


def test_a_plug_in_only_one_run_loaded_is_no_finding():
    """A subset that needed none of the plug-in's methods did not load it: nothing changed."""
    entry = {"module": "mine", "distribution": "mine", "version": "1", "sha256": "a98abd0d7de8ff"}
    baseline, current = run(case(m=lower(1))), run(case(m=lower(1)))
    baseline.plugins = {"mine": entry}
    assert gate(current, baseline, [REL5]).reasons == []
    current.plugins = {"mine": {**entry, "sha256": "bbbbbbbbbbbbbb"}}
    assert gate(current, baseline, [REL5]).reasons == [
        "plug-in mine changed: mine 1, source sha256 a98abd0d7de8 in the baseline, mine 1, "
        "source sha256 bbbbbbbbbbbb now"]


def test_new_case_is_listed_and_not_gated():
    report = gate(run(case("a/m/x", m=lower(1)), case("n/m/x", m=lower(1))),
                  run(case("a/m/x", m=lower(1))), [REL5])
    assert report.new_cases == ["n/m/x"]
    assert report.exit_code() == 0


def test_failed_case_in_current_run_is_listed_and_regresses():
    report = gate(run(case(status="error")), run(case(m=lower(1))), [REL5])
    assert report.failed_cases == ["proofs/m/x=1"]
    assert report.exit_code() == 1


def test_other_data_is_not_comparable_and_exits_4():
    report = gate(run(case(comparable={"tokens_sha256": "aaa"}, m=lower(2))),
                  run(case(comparable={"tokens_sha256": "bbb"}, m=lower(1))), [REL5])
    assert report.not_comparable_cases == ["proofs/m/x=1"]
    assert report.reasons == ["proofs/m/x=1: not comparable, its definition differs: "
                              "data.tokens_sha256: 'bbb' -> 'aaa'"]
    assert [r.verdict for r in report.rows] == ["not comparable"]
    assert report.exit_code() == 0  # marked, never judged; strict makes it exit 4
    assert gate(run(case(comparable={"tokens_sha256": "aaa"}, m=lower(2))),
                run(case(comparable={"tokens_sha256": "bbb"}, m=lower(1))), [REL5],
                strict=True).exit_code() == 4


def test_another_method_setting_under_the_same_label_is_never_a_regression():
    """The issue's case: a baseline of `intq` bits 4 under label q, gated with bits 8."""
    report = gate(run(case(method_params={"bits": 8, "group_size": 32}, ratio=higher(1.778),
                           mse=lower(0.0001))),
                  run(case(method_params={"bits": 4, "group_size": 32}, ratio=higher(3.2),
                           mse=lower(0.006))), [REL5])
    assert report.regressions == [] and report.improvements == []
    assert {r.verdict for r in report.rows} == {"not comparable"}
    assert report.exit_code() == 0 and report.not_comparable_cases == ["proofs/m/x=1"]
    assert report.reasons == ["proofs/m/x=1: not comparable, its definition differs: "
                              "method_params.bits: 4 -> 8"]


def test_the_comparable_cases_are_still_gated_beside_one_that_is_not():
    """One changed setting does not blind the gate: the other case's regression counts."""
    changed = case(method_params={"bits": 8}, m=lower(1))
    changed.id = "proofs/other/x=1"
    old_changed = case(method_params={"bits": 4}, m=lower(1))
    old_changed.id = "proofs/other/x=1"
    report = gate(run(case(m=lower(2)), changed), run(case(m=lower(1)), old_changed), [REL5])
    assert report.not_comparable_cases == ["proofs/other/x=1"]
    assert [r.case_id for r in report.regressions] == ["proofs/m/x=1"]
    assert report.exit_code() == 1
    assert gate(run(case(m=lower(2)), changed), run(case(m=lower(1)), old_changed), [REL5],
                strict=True).exit_code() == 4


def test_records_without_a_fingerprint_are_compared_field_by_field():
    old, new = case(m=lower(1)), case(m=lower(1.01))
    old.fingerprint = new.fingerprint = ""  # written by schema 1
    assert gate(run(new), run(old), [REL5]).exit_code() == 0
    new.method_params = {"bits": 2}
    assert gate(run(new), run(old), [REL5]).not_comparable_cases == ["proofs/m/x=1"]


def test_a_setting_added_since_the_baseline_left_unset_keeps_the_case_comparable():
    """The baseline predates a benchmark setting whose unset value is None (perplexity's
    server): the case is the same; set to anything, it is another case."""
    old = case(m=lower(1))
    new = case(m=lower(1.01))
    new.bench_params = {"server": None}
    new.fingerprint = fingerprint(new)
    assert new.fingerprint != old.fingerprint
    assert gate(run(new), run(old), [REL5]).exit_code() == 0
    new.bench_params = {"server": "llama.cpp"}
    report = gate(run(new), run(old), [REL5])
    assert report.reasons == ["proofs/m/x=1: not comparable, its definition differs: "
                              "bench_params.server: (absent) -> 'llama.cpp'"]


def test_a_baseline_record_edited_by_hand_is_not_comparable():
    old, new = case(m=lower(1)), case(m=lower(1))
    old.method_params = {"bits": 4}  # its stored fingerprint is of method_params {}
    new.method_params = {"bits": 4}
    new.fingerprint = fingerprint(new)
    report = gate(run(new), run(old), [REL5])
    assert report.not_comparable_cases == ["proofs/m/x=1"]
    assert "edited by hand" in report.reasons[0]


def test_machine_key_mismatch_exits_4():
    report = gate(run(case(m=lower(1)), key="darwin-arm64-apple-mps"),
                  run(case(m=lower(1))), [REL5])
    assert not report.comparable
    assert any("machine key" in r for r in report.reasons)
    assert report.exit_code() == 4


def test_schema_version_and_suite_name_mismatch_exit_4():
    by_schema = gate(run(case(m=lower(1)), schema=1), run(case(m=lower(1))), [REL5])
    assert any("schema_version" in r for r in by_schema.reasons)
    assert by_schema.exit_code() == 4
    by_suite = gate(run(case(m=lower(1)), suite="other"), run(case(m=lower(1))), [REL5])
    assert by_suite.exit_code() == 4
