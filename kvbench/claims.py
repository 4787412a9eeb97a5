"""Claims: `metric op value`, stated in a suite, judged against a case's metrics."""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from kvbench.results import ClaimResult, Metric

OPS = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
    "==": operator.eq, "!=": operator.ne,
}
_CLAIM = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Claim:
    text: str
    metric: str
    op: str
    target: float
    source: str = ""  # "file:line" where it was stated


def parse_claim(text: str, source: str = "") -> Claim:
    """Parse "cosine >= 0.99"; raise ValueError with the expected form otherwise."""
    match = _CLAIM.match(str(text))
    if not match:
        raise ValueError(
            f"claim {text!r} is not of the form 'metric op value' (op one of {' '.join(OPS)})"
        )
    metric, op, raw = match.groups()
    try:
        target = float(raw)
    except ValueError:
        raise ValueError(f"claim {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(target):
        raise ValueError(f"claim {text!r}: the target must be a finite number")
    return Claim(text=" ".join(match.groups()), metric=metric, op=op, target=target, source=source)


def judge(claim: Claim, metrics: dict[str, Metric]) -> ClaimResult:
    """held / failed, or missing when the case did not report the metric. A NaN or infinite
    measurement fails every claim: `perplexity >= 1` must not hold for a diverged run."""
    metric = metrics.get(claim.metric)
    measured = None if metric is None else metric.value
    if measured is None:
        verdict = "missing"
    elif not math.isfinite(measured):
        verdict = "failed"
    else:
        verdict = "held" if OPS[claim.op](measured, claim.target) else "failed"
    return ClaimResult(
        claim=claim.text, metric=claim.metric, op=claim.op, target=claim.target,
        measured=measured, verdict=verdict, source=claim.source,
    )
