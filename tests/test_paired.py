"""Paired comparisons (kvbench.judge.paired): the exact sign test against hand-computed binomial
tails, a seeded bootstrap interval, and — from result records, through the ruler report and the
claims a run judges — a method that drops the needle separated from identity at the shipped
sample count, and not at two samples a cell."""
from __future__ import annotations

import re

import pytest

from kvbench.benchmarks.reports.ruler import ruler_section
from kvbench.judge.claims import parse_claim
from kvbench.judge.paired import (
    compare_paired, differences, fewest_pairs_to_separate, paired_interval, paired_samples,
    per_sample, sign_test_p,
)
from kvbench.report.html import build_site
from kvbench.reportkit.tables import fmt_number
from kvbench.report.markdown import render_markdown
from kvbench.results import CaseResult, Metric, RunResult, SuiteRecord
from kvbench.run.runner import judge_across
from kvbench.suite.case import Case
from tests.plugins.suites import ROOT

SHIPPED_SAMPLES = 40  # per RULER task at 1K in the shipped suites
TODAY_SAMPLES = 2  # per cell in the RULER run of 8638e4f, the README's 2K/4K figures


@pytest.mark.parametrize("wins, losses, p", [
    (0, 5, 2 / 2 ** 5),  # 2 x P(X = 0), n = 5: 0.0625
    (5, 0, 2 / 2 ** 5),  # two-sided: the same either way
    (1, 9, 2 * (1 + 10) / 2 ** 10),  # 2 x (C(10,0) + C(10,1)) / 2^10
    (2, 8, 2 * (1 + 10 + 45) / 2 ** 10),
    (0, 6, 2 / 2 ** 6),
    (3, 3, 1.0),  # 2 x 42/64 is above 1: capped
    (0, 0, 1.0),  # only ties: nothing to say
])
def test_sign_test_is_the_exact_two_sided_binomial_tail(wins, losses, p):
    assert sign_test_p(wins, losses) == p


def test_six_pairs_is_the_fewest_the_sign_test_can_separate():
    assert sign_test_p(0, 5) > 0.05 > sign_test_p(0, 6)
    assert fewest_pairs_to_separate() == 6
    assert fewest_pairs_to_separate(0.01) == 8  # 2/128 = 0.0156, 2/256 = 0.0078


def test_interval_is_seeded_and_brackets_the_mean():
    apart = [0, -100, 0, 0, -50, -100, 0, 25, 0, -100, 0, 0]
    mean, low, high = paired_interval(apart)
    assert paired_interval(apart) == (mean, low, high)  # the same scores, the same interval
    assert mean == pytest.approx(sum(apart) / len(apart))
    assert low < mean < high and low >= min(apart) and high <= max(apart)
    narrow = paired_interval(apart, level=0.5)
    assert low <= narrow[1] <= narrow[2] <= high
    assert paired_interval([-7.5] * 9) == (-7.5, -7.5, -7.5)
    with pytest.raises(ValueError, match="at least one pair"):
        paired_interval([])


def test_identity_against_itself_is_not_separated():
    scores = [100, 0, 100, 33.3, 100, 0]
    same = compare_paired(scores, scores)
    assert (same.pairs, same.wins, same.losses, same.p_value) == (6, 0, 0, 1.0)
    assert (same.mean_difference, same.low, same.high) == (0, 0, 0)
    assert same.verdict == "not separated"


def test_verdict_follows_the_direction_of_the_metric():
    low, high = [1.0] * 8, [2.0] * 8
    assert compare_paired(high, low).verdict == "better"
    assert compare_paired(high, low, higher_is_better=False).verdict == "worse"
    assert compare_paired(low, high, higher_is_better=False).verdict == "better"


def test_pairs_must_be_one_per_sample():
    with pytest.raises(ValueError, match="3 against 2"):
        differences([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="1 against 2"):
        compare_paired([1], [1, 1])


# ---- from result records --------------------------------------------------------------------

def ruler_record(label: str, scores: list[float], prompts: str = "the same prompts") -> CaseResult:
    """A finished ruler case of niah_single_1 at 1K, its per-sample scores as the run keeps them."""
    return CaseResult(
        id=f"ruler/{label}/task=niah_single_1,length=1024", benchmark="ruler",
        bench_params={"task": "niah_single_1", "length": 1024, "samples": len(scores),
                      "data_seed": 0},
        method=label, method_label=label, method_params={}, status="ok",
        metrics={"score": Metric(value=sum(scores) / len(scores), unit="%", direction="higher")},
        info={"scores": scores}, comparable={"prompts_sha256": prompts})


def needle_run(samples: int) -> RunResult:
    """identity finds every needle; `dropper` drops three of every four."""
    cases = [ruler_record("identity", [100.0] * samples),
             ruler_record("dropper", [100.0 if i % 4 == 0 else 0.0 for i in range(samples)])]
    return RunResult(kvbench_version="0", git_sha=None, machine={"key": "test"},
                     suite=SuiteRecord(name="needles", path="needles.yaml", hash="0" * 64,
                                       resolved={}), started="2026-01-01T00:00:00+00:00",
                     cases=cases)


def against_identity_row(result: RunResult) -> list[str]:
    section = ruler_section(result)
    table = section[section.index("### RULER: against identity"):]
    line = next(line for line in table.splitlines() if line.startswith("| dropper |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_method_that_drops_the_needle_is_worse_at_the_shipped_sample_count():
    result = needle_run(SHIPPED_SAMPLES)
    identity, dropper = result.cases
    pair = paired_samples(dropper, identity)
    assert pair == (dropper.info["scores"], identity.info["scores"])
    comparison = compare_paired(*pair)
    assert (comparison.pairs, comparison.wins, comparison.losses) == (40, 0, 30)
    assert comparison.p_value == 2 / 2 ** 30 and comparison.verdict == "worse"
    assert comparison.mean_difference == -75 and comparison.high < 0
    row = against_identity_row(result)
    assert row[:4] == ["dropper", "1K", "40", "0 / 30"]
    assert row[4].startswith("−75.0 [") and row[5:] == ["< 0.001", "worse"]


def test_two_samples_a_cell_cannot_separate_even_a_method_that_drops_every_needle():
    result = needle_run(TODAY_SAMPLES)
    identity, dropper = result.cases
    dropper.info["scores"] = [0.0, 0.0]
    comparison = compare_paired(*paired_samples(dropper, identity))
    assert (comparison.losses, comparison.p_value) == (2, 0.5)  # 2 x (1/2)^2
    assert comparison.verdict == "not separated"
    assert against_identity_row(result)[-1] == "not separated"


def test_other_samples_are_not_paired():
    result = needle_run(SHIPPED_SAMPLES)
    identity, dropper = result.cases
    dropper.comparable["prompts_sha256"] = "other prompts"
    assert paired_samples(dropper, identity) is None
    assert against_identity_row(result)[-1] == "not paired: different samples"
    assert per_sample(dropper) == dropper.info["scores"]
    assert per_sample(dropper, "compression_ratio") is None  # no per-sample values of it
    dropper.info["scores"][0] = float("nan")  # a NaN would pass as a tie: nothing to pair
    assert per_sample(dropper) is None and paired_samples(dropper, identity) is None


def test_a_case_that_stopped_sooner_pairs_on_the_samples_both_answered():
    identity = ruler_record("identity", [100.0] * 40, prompts="40 prompts")
    dropper = ruler_record("dropper", [0.0] * 16, prompts="16 prompts")
    identity.info["prompt_sha256s"] = [f"p{i}" for i in range(40)]
    dropper.info["prompt_sha256s"] = [f"p{i}" for i in range(16)]
    assert paired_samples(dropper, identity) == ([0.0] * 16, [100.0] * 16)
    dropper.info["prompt_sha256s"][3] = "another prompt"  # pairs up to the first that differs
    assert paired_samples(dropper, identity) == ([0.0] * 3, [100.0] * 3)
    dropper.info["prompt_sha256s"][0] = "another prompt"
    assert paired_samples(dropper, identity) is None


def judged(result: RunResult, claim: str) -> list:
    """The run's verdicts of `claim` stated on the dropper's case, as the runner judges them."""
    cases = [Case(id=record.id, benchmark="ruler", bench_params=record.bench_params,
                  method=record.method, method_label=record.method_label, method_params={},
                  model=None, device="cpu", seed=0, repeats=1, timeout_s=None,
                  claims=[parse_claim(claim)] if record.method == "dropper" else [])
             for record in result.cases]
    judge_across(result, cases)
    return result.cases[1].claims


def test_a_difference_claim_is_judged_on_the_paired_bound(tmp_path):
    # The means differ by 75 points: "not worse by more than 80" would hold on them.
    result = needle_run(SHIPPED_SAMPLES)
    [claim] = judged(result, "score - identity >= -80")
    _, low, high = paired_interval(differences(*paired_samples(*result.cases[::-1])))
    assert low < -80 < -75
    assert (claim.measured, claim.verdict) == (low, "failed")
    assert claim.measured_as == "low bound of the 95% paired interval, 40 samples"
    assert (f"| {fmt_number(low, '%')} (low bound of the 95% paired interval, 40 samples) "
            "| ❌ failed |") in render_markdown(result)
    page = build_site([("needles.json", result)], tmp_path / "site").read_text()
    assert "(low bound of the 95% paired interval, 40 samples)" in page  # the HTML says it too
    [claim] = judged(needle_run(SHIPPED_SAMPLES), "score - identity < -50")
    assert (claim.measured, claim.verdict) == (high, "held")
    assert claim.measured_as.startswith("high bound")


def test_a_stress_score_alone_claim_pairs_the_single_user_answers():
    """stress's `score` is under load and keeps no per-sample scores; its single-user answers
    (info.scores_alone, in prompt order) are what `score_alone - identity` pairs."""
    result = needle_run(SHIPPED_SAMPLES)
    for case in result.cases:
        case.info["scores_alone"] = case.info.pop("scores")
        case.metrics["score_alone"] = case.metrics.pop("score")
    assert per_sample(result.cases[1], "score_alone") == result.cases[1].info["scores_alone"]
    assert per_sample(result.cases[1]) is None  # no under-load scores to pair
    [claim] = judged(result, "score_alone - identity < -50")
    _, _, high = paired_interval(differences(*paired_samples(*result.cases[::-1], "score_alone")))
    assert (claim.measured, claim.verdict) == (high, "held")
    assert claim.measured_as.startswith("high bound")


def test_without_the_same_samples_a_claim_is_judged_on_the_means():
    result = needle_run(SHIPPED_SAMPLES)
    result.cases[1].comparable["prompts_sha256"] = "other prompts"
    [claim] = judged(result, "score - identity >= -80")
    assert (claim.measured, claim.verdict, claim.measured_as) == (-75, "held", None)
    # a ratio, or an equality, is judged on the means even when the samples pair
    [ratio] = judged(needle_run(SHIPPED_SAMPLES), "score / identity >= 0.25")
    assert (ratio.measured, ratio.verdict, ratio.measured_as) == (0.25, "held", None)
    [equal] = judged(needle_run(SHIPPED_SAMPLES), "score - identity == -75")
    assert (equal.measured, equal.verdict, equal.measured_as) == (-75, "held", None)


def test_the_committed_ruler_report_separates_every_method_from_identity_per_length():
    """reports/ruler: every (method, length) mean within ±15 points, and every method with a
    verdict against identity and its p."""
    text = (ROOT / "reports/ruler/report.md").read_text()
    means = text.split("### RULER: mean score over tasks, per context length")[1].split("<sub>")[0]
    rows = [line for line in means.splitlines()
            if line.startswith("| ") and not line.startswith(("| method", "| ---"))]
    assert len(rows) >= 13
    for low, high in (map(float, m) for row in rows
                      for m in re.findall(r"\[([\d.]+)–([\d.]+)\]", row)):
        assert (high - low) / 2 < 15, rows
    against = text.split("### RULER: against identity, on the same samples")[1].split("<sub>")[0]
    judged = re.findall(r"^\| (\S+) \| \d+K \| \d+ \| .* \| [<\d. ]+ \| "
                        r"(?:worse|not separated|better) \|$", against, re.M)
    methods = {row.split("|")[1].strip() for row in rows} - {"identity"}
    assert set(judged) == methods


def test_a_not_separated_claim_is_the_reports_sign_test():
    """`score ~ identity` holds where the report says "not separated" (the sign test's p is at
    least 0.05) and fails where it separates them; its measured is that p."""
    result = needle_run(SHIPPED_SAMPLES)
    [claim] = judged(result, "score ~ identity")
    assert (claim.measured, claim.verdict) == (2 / 2 ** 30, "failed")
    assert claim.measured_as == "sign test p over 40 samples (0 above, 30 below): worse"
    close = needle_run(SHIPPED_SAMPLES)
    close.cases[1].info["scores"] = [0.0, 0.0, 0.0] + [100.0] * (SHIPPED_SAMPLES - 3)
    [claim] = judged(close, "score ~ identity")
    assert claim.verdict == "held" and claim.measured == 0.25  # 3 of 3 differing pairs
    assert "| score ~ identity | 0.25 (sign test p over 40 samples" in render_markdown(close)


def test_a_paired_claim_is_judged_paired_or_not_at_all():
    """Written `(paired)`, a difference claim without per-sample values on the same samples is
    missing, where the plain form falls back to the means; `~` needs them too."""
    [claim] = judged(needle_run(SHIPPED_SAMPLES), "score - identity >= -80 (paired)")
    assert claim.verdict == "failed" and claim.measured_as.startswith("low bound")
    assert claim.claim == "score - identity >= -80 (paired)"

    def unpaired(text: str):
        result = needle_run(SHIPPED_SAMPLES)
        result.cases[1].comparable["prompts_sha256"] = "other prompts"
        [claim] = judged(result, text)
        return claim

    for text in ("score - identity >= -80 (paired)", "score ~ identity"):
        claim = unpaired(text)
        assert (claim.measured, claim.verdict) == (None, "missing")
        assert claim.measured_as == "no per-sample values of both cases on the same samples"
    claim = unpaired("score - identity >= -80")
    assert (claim.measured, claim.verdict) == (-75, "held")


@pytest.mark.parametrize("text, message", [
    ("score / identity >= 0.5 (paired)", "'(paired)' judges a difference"),
    ("score ~", "is not of the form"),
])
def test_malformed_paired_claims_are_refused(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_claim(text)


def test_a_paired_claim_on_a_metric_without_per_sample_values_is_refused_at_its_line(tmp_path):
    from kvbench.suite.errors import SuiteError
    from kvbench.suite.loader import load_suite
    from tests.test_claims_across import SUITE

    path = tmp_path / "s.yaml"
    path.write_text(SUITE.replace('claim: "kv_bytes - identity < 0"', 'claim: "perplexity ~ identity"'))
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert "claim 'perplexity ~ identity' is judged on per-sample values" in str(err.value)
