"""Claims: `metric op value`, stated in a suite, judged against a case's metrics; or
`metric / LABEL op value` and `metric - LABEL op value`, judged against the ratio to (or the
difference from) the same metric of the case that ran method LABEL on the same benchmark
parameters in the same run (seed 003's "peak x 0.51 against stock" is
`peak_bytes / identity <= 0.51`).

A difference claim (`score - identity >= -5`) whose two cases recorded the metric's per-sample
values on the same samples is judged on the 95% paired interval of the difference instead of
the difference of the means: the low bound must clear a `>=` or `>` target, the high bound a
`<=` or `<` one, so that noise cannot pass a method that is worse by more than stated."""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Sequence

from kvbench.judge.paired import LEVEL, differences, paired_interval
from kvbench.results import ClaimResult, Metric

OPS = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
    "==": operator.eq, "!=": operator.ne,
}
RELATIONS = {"/": operator.truediv, "-": operator.sub}
# The bound of the paired interval a difference claim is judged on, by op.
PAIRED_BOUNDS = {">=": "low", ">": "low", "<=": "high", "<": "high"}
_CLAIM = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?:([/-])\s*([\w.+-]+)\s*)?"
                    r"(>=|<=|==|!=|>|<)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Claim:
    text: str
    metric: str
    op: str
    target: float
    source: str = ""  # "file:line" where it was stated
    # Another case's metric this one is set against: the method label, and "/" or "-".
    reference: str | None = None
    relation: str | None = None
    goal: str | None = None  # a goal not met yet, and why: its failure does not fail the run

    def reference_id(self, case_id: str, benchmark: str, label: str) -> str:
        """The id of the case this claim compares `case_id` (which ran method `label`) with."""
        rest = case_id[len(benchmark) + 1 + len(label):]
        return f"{benchmark}/{self.reference}{rest}"


def parse_claim(text: str, source: str = "") -> Claim:
    """Parse "cosine >= 0.99" or "peak_bytes / identity <= 0.51"; raise ValueError with the
    expected form otherwise."""
    match = _CLAIM.match(str(text))
    if not match:
        raise ValueError(
            f"claim {text!r} is not of the form 'metric op value' or 'metric / LABEL op value'"
            f" ('-' for a difference; op one of {' '.join(OPS)})"
        )
    metric, relation, reference, op, raw = match.groups()
    try:
        target = float(raw)
    except ValueError:
        raise ValueError(f"claim {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(target):
        raise ValueError(f"claim {text!r}: the target must be a finite number")
    return Claim(text=" ".join(g for g in match.groups() if g is not None), metric=metric,
                 op=op, target=target, source=source, reference=reference, relation=relation)


def judge(claim: Claim, metrics: dict[str, Metric],
          reference: dict[str, Metric] | None = None, reference_id: str | None = None,
          pairs: tuple[Sequence[float], Sequence[float]] | None = None) -> ClaimResult:
    """held / failed (unmet for a goal), or missing when the case (or, for a claim against
    another case, that case: `reference`, None when it did not run or failed) did not report
    the metric. A NaN or infinite measurement fails every claim: `perplexity >= 1` must not
    hold for a diverged run. `pairs`: both cases' per-sample values of the metric on the same
    samples (this case's first), when they recorded them; a difference claim is then judged on
    a paired bound."""
    metric = metrics.get(claim.metric)
    measured = None if metric is None else metric.value
    measured_as = None
    if claim.reference is not None:
        other = (reference or {}).get(claim.metric)
        bound = PAIRED_BOUNDS.get(claim.op) if claim.relation == "-" else None
        if measured is None or other is None:
            measured = None
        elif pairs is not None and bound is not None:
            _, low, high = paired_interval(differences(*pairs))
            measured = low if bound == "low" else high
            measured_as = (f"{bound} bound of the {LEVEL:.0%} paired interval, "
                           f"{len(pairs[0])} samples")
        else:
            with_zero = claim.relation == "/" and other.value == 0
            measured = math.nan if with_zero else RELATIONS[claim.relation](measured, other.value)
    if measured is None:
        verdict = "missing"
    elif not math.isfinite(measured):
        verdict = "failed"
    else:
        verdict = "held" if OPS[claim.op](measured, claim.target) else "failed"
    if verdict == "failed" and claim.goal:
        verdict = "unmet"
    return ClaimResult(
        claim=claim.text, metric=claim.metric, op=claim.op, target=claim.target,
        measured=measured, verdict=verdict, source=claim.source, reference=reference_id,
        measured_as=measured_as, goal=claim.goal,
    )
