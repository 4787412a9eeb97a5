"""Two methods on the same samples: is one worse, better, or not separated from the other?

- An exact sign test over the pairs that differ (for pass/fail scores it is the exact McNemar
  test: the discordant pairs are split 50/50 if neither method is better). Two-sided.
- A paired percentile bootstrap interval for the mean difference, resampling pairs with a fixed
  seed, so the same scores always give the same interval and a report re-renders to the byte.

The verdict comes from the test; the interval says by how much. `paired_samples` finds two
result records' per-sample values of a metric when they were measured on the same samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from kvbench.results import CaseResult

SEPARATION_LEVEL = 0.05  # two-sided p below this separates two methods
RESAMPLES = 10_000
LEVEL = 0.95  # of the paired interval
# Where a case records per-sample values, in the order of its samples: info[key]. "score" is
# their mean (stress's "score_alone": its single-user pass's); the others are what output-length
# drift pairs (tokens generated, seconds taken).
PER_SAMPLE = {"score": "scores", "score_alone": "scores_alone", "generated_tokens": "generated",
              "answer_s": "answer_s"}

Separation = Literal["worse", "not separated", "better"]


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact binomial p-value of `wins` against `losses` at one half (ties dropped
    before: they say nothing about which is better)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def fewest_pairs_to_separate(level: float = SEPARATION_LEVEL) -> int:
    """The fewest differing pairs with which the sign test can separate at all (all on one
    side): 6 at 0.05."""
    n = 1
    while sign_test_p(0, n) >= level:
        n += 1
    return n


def paired_interval(differences: Sequence[float], level: float = LEVEL,
                    resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of paired differences: a percentile bootstrap over the
    pairs, seeded."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("a paired interval needs at least one pair")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(d.mean()), float(low), float(high)


@dataclass(frozen=True)
class PairedComparison:
    """`method` against `reference` on the same samples, in the scores' unit."""

    pairs: int
    wins: int  # samples where method scored above the reference
    losses: int
    p_value: float
    mean_difference: float  # method - reference
    low: float
    high: float
    verdict: Separation


def differences(method: Sequence[float], reference: Sequence[float]) -> list[float]:
    """method - reference, sample by sample (the i-th of each is the same sample)."""
    if len(method) != len(reference):
        raise ValueError(f"paired scores need one per sample on both sides: "
                         f"{len(method)} against {len(reference)}")
    return [float(a) - float(b) for a, b in zip(method, reference)]


def compare_paired(method: Sequence[float], reference: Sequence[float],
                   higher_is_better: bool = True, seed: int = 0) -> PairedComparison:
    """Compare scores sample by sample (the i-th of each is the same sample)."""
    apart = differences(method, reference)
    wins = sum(d > 0 for d in apart)
    losses = sum(d < 0 for d in apart)
    p = sign_test_p(wins, losses)
    mean, low, high = paired_interval(apart, seed=seed)
    verdict: Separation = "not separated"
    if p < SEPARATION_LEVEL:
        ahead = (wins > losses) == higher_is_better
        verdict = "better" if ahead else "worse"
    return PairedComparison(len(apart), wins, losses, p, mean, low, high, verdict)


def per_sample(case: CaseResult, metric: str = "score") -> list[float] | None:
    """The case's per-sample values of `metric` (whose mean the metric is), in the order of its
    samples; None when it recorded none, or any that is not a finite number."""
    values = case.info.get(PER_SAMPLE.get(metric, ""))
    if not isinstance(values, list) or not values:
        return None
    try:
        floats = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    return floats if all(map(math.isfinite, floats)) else None


def same_samples(case: CaseResult, other: CaseResult) -> bool:
    """Whether two cases ran the same prompts in the same order: their
    comparable["prompts_sha256"] match (two that recorded none are taken at their parameters,
    which the caller has matched)."""
    return case.comparable.get("prompts_sha256") == other.comparable.get("prompts_sha256")


def paired_samples(case: CaseResult, other: CaseResult, metric: str = "score"
                   ) -> tuple[list[float], list[float]] | None:
    """Both cases' per-sample values of `metric` on the samples both answered: where both
    recorded each sample's prompt hash (info.prompt_sha256s), the first samples, as far as the
    hashes agree (a case sampled to a precision may stop before the other); else all of them,
    when both ran the same prompts. None when no sample pairs."""
    mine, theirs = per_sample(case, metric), per_sample(other, metric)
    if mine is None or theirs is None:
        return None
    hashes, other_hashes = _prompt_hashes(case, mine), _prompt_hashes(other, theirs)
    if hashes is not None and other_hashes is not None:
        common = 0
        for a, b in zip(hashes, other_hashes):
            if a != b:
                break
            common += 1
        return (mine[:common], theirs[:common]) if common else None
    if len(mine) != len(theirs):
        return None
    return (mine, theirs) if same_samples(case, other) else None


def _prompt_hashes(case: CaseResult, values: list[float]) -> list | None:
    hashes = case.info.get("prompt_sha256s")
    return hashes if isinstance(hashes, list) and len(hashes) == len(values) else None
