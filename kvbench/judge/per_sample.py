"""A case against its baseline sample by sample: where both records hold a metric's per-sample
values on the same samples (kvbench.judge.paired.paired_samples: their prompt hashes, or the
same prompts), the report's paired sign test says whether the samples got worse, and the
samples that did are listed with their answers where the records kept them (info.predictions).

A silent per-sample regression (compression run on the first sample only; a method that loses
a few samples while the mean stays inside its tolerance) is what this catches and a tolerance on
the mean does not.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.judge.paired import PER_SAMPLE, PairedComparison, compare_paired, paired_samples
from kvbench.results import CaseResult


@dataclass(frozen=True)
class FlippedSample:
    """A sample whose value got worse than the baseline's: its index, prompt hash and answers
    (None where the record kept none)."""

    index: int
    prompt_sha256: str | None
    before: float
    after: float
    before_answer: str | None
    after_answer: str | None


@dataclass(frozen=True)
class SampleShift:
    """One case's per-sample values of `metric` against the baseline's."""

    case_id: str
    metric: str
    comparison: PairedComparison  # this run's samples against the baseline's
    worse: list[FlippedSample]

    @property
    def rule(self) -> str:
        c = self.comparison
        better = c.wins + c.losses - len(self.worse)
        samples = f"{c.pairs} sample" + ("s" if c.pairs != 1 else "")
        return (f"paired sign test over {samples}: {len(self.worse)} worse, {better} better,"
                f" p = {c.p_value:.2g}")


def sample_shifts(old: CaseResult, new: CaseResult, directions: dict[str, str]
                  ) -> list[SampleShift]:
    """The shift of every metric both records hold per sample (`directions`: each metric's
    better direction, "higher" or "lower")."""
    shifts = []
    for metric in PER_SAMPLE:
        if metric not in directions or metric not in old.metrics:
            continue
        pairs = paired_samples(new, old, metric)
        if not pairs:
            continue
        higher = directions[metric] == "higher"
        now, before = pairs
        comparison = compare_paired(now, before, higher_is_better=higher)
        hashes = _listed(new, "prompt_sha256s", len(now))
        answers_now = _listed(new, "predictions", len(now))
        answers_before = _listed(old, "predictions", len(before))
        worse = [FlippedSample(i, hashes[i], b, a, answers_before[i], answers_now[i])
                 for i, (a, b) in enumerate(zip(now, before)) if (a < b if higher else a > b)]
        shifts.append(SampleShift(new.id, metric, comparison, worse))
    return shifts


def _listed(case: CaseResult, key: str, count: int) -> list:
    """The first `count` entries of info[key], or Nones where the record has no such list."""
    values = case.info.get(key)
    if not isinstance(values, list) or len(values) < count:
        return [None] * count
    return values[:count]
