"""The gate pairs a case's per-sample records with the baseline's (kvbench.judge.per_sample): a
method that lost a few samples fails the gate although its mean stays inside the tolerance, and
the report and `kvbench compare` list the samples that got worse, with their answers."""
from __future__ import annotations

from kvbench.judge.gate import GatePolicy, gate
from kvbench.judge.tolerance import Tolerance
from kvbench.report.compare import render_compare
from kvbench.report.markdown import render_markdown
from kvbench.results import CaseResult, Metric
from tests.test_gate import run

SCORE_ABS10 = GatePolicy(Tolerance(rel=0.02), {"score": Tolerance(abs=10.0)})
SAMPLES = 200


def ruler_case(scores: list[float], answers: list[str] | None = None, hashes=None) -> CaseResult:
    count = len(scores)
    return CaseResult(
        id="ruler/intq4/length=1024", benchmark="ruler", bench_params={"length": 1024},
        method="intq", method_label="intq4", method_params={"bits": 4}, status="ok",
        metrics={"score": Metric(value=sum(scores) / count, unit="points", direction="higher")},
        info={"scores": scores, "prompt_sha256s": hashes or [f"{i:064x}" for i in range(count)],
              "predictions": answers or ["the key is 4217"] * count},
        comparable={"prompts_sha256": "same"})


def _baseline_and_broken(broken: list[int]) -> tuple[CaseResult, CaseResult]:
    right = [100.0] * SAMPLES
    wrong = [0.0 if i in broken else 100.0 for i in range(SAMPLES)]
    answers = ["nothing" if i in broken else "the key is 4217" for i in range(SAMPLES)]
    return ruler_case(right), ruler_case(wrong, answers)


def test_a_few_samples_lost_fail_the_gate_though_the_mean_stays_inside_its_tolerance():
    baseline, broken = _baseline_and_broken([3, 17, 40, 41, 90, 120, 150, 199])
    report = gate(run(broken), run(baseline), [SCORE_ABS10])
    rows = {row.metric: row for row in report.rows}
    assert rows["score"].verdict == "same"  # 4 points down: inside abs 10
    assert rows["score per sample"].verdict == "regression"
    assert "8 worse, 0 better" in rows["score per sample"].rule
    assert report.regressed() and report.exit_code() == 1
    (shift,) = report.sample_shifts
    assert [s.index for s in shift.worse] == [3, 17, 40, 41, 90, 120, 150, 199]
    assert shift.worse[0].prompt_sha256 == f"{3:064x}"
    assert (shift.worse[0].before_answer, shift.worse[0].after_answer) == (
        "the key is 4217", "nothing")


def test_flips_both_ways_within_the_noise_are_no_regression():
    baseline = ruler_case([100.0 if i % 2 else 0.0 for i in range(SAMPLES)])
    now = [100.0 if i % 2 else 0.0 for i in range(SAMPLES)]
    for i in (1, 3, 5):  # three right -> wrong, three wrong -> right
        now[i] = 0.0
    for i in (0, 2, 4):
        now[i] = 100.0
    report = gate(run(ruler_case(now)), run(baseline), [SCORE_ABS10])
    row = next(row for row in report.rows if row.metric == "score per sample")
    assert row.verdict == "same" and not report.regressed()
    assert [s.index for s in report.sample_shifts[0].worse] == [1, 3, 5]


def test_samples_pair_by_prompt_hash_as_far_as_both_ran_them():
    """A run sampled to a precision may stop early: its samples pair with the baseline's first
    ones; the baseline's later samples are not read."""
    baseline = ruler_case([100.0] * SAMPLES)
    stopped = ruler_case([0.0] * 6 + [100.0] * 54, hashes=[f"{i:064x}" for i in range(60)])
    report = gate(run(stopped), run(baseline), [SCORE_ABS10])
    (shift,) = report.sample_shifts
    assert shift.comparison.pairs == 60 and len(shift.worse) == 6
    assert shift.comparison.verdict == "worse"  # 6 of 6 differing pairs: p = 0.03


def test_the_report_and_compare_list_the_samples_that_got_worse():
    baseline, broken = _baseline_and_broken([3, 17, 40, 41, 90, 120, 150, 199])
    current, stored = run(broken), run(baseline)
    report = gate(current, stored, [SCORE_ABS10])
    for text in (render_markdown(current, report), render_compare(stored, current, report)):
        assert "8 worse, 0 better" in text
        assert f"| 17 | {f'{17:064x}'[:12]} | 100 | 0 |" in text
        assert "| the key is 4217 | nothing |" in text
