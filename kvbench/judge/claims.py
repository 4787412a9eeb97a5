"""Claims: `metric op value`, stated in a suite, judged against a case's metrics; or
`metric / LABEL op value` and `metric - LABEL op value`, judged against the ratio to (or the
difference from) the same metric of the case that ran method LABEL on the same benchmark
parameters in the same run (seed 003's "peak x 0.51 against stock" is
`peak_bytes / identity <= 0.51`).

A difference claim (`score - identity >= -5`) whose two cases recorded the metric's per-sample
values on the same samples is judged on the 95% paired interval of the difference instead of
the difference of the means: the low bound must clear a `>=` or `>` target, the high bound a
`<=` or `<` one, so that noise cannot pass a method that is worse by more than stated. Written
`score - identity >= -5 (paired)`, it is judged paired or not at all (missing without per-sample
values on the same samples).

`score ~ identity` claims what the report's paired verdict says, "not separated": the exact
sign test over the samples both answered (kvbench.judge.paired.compare_paired, the report's)
finds no difference at the 0.05 level; its `measured` is the test's p-value.

A claim calibrated on one model (its `model`) is not judged on a case that runs another: it is
recorded `skipped`, with the reason, and fails nothing."""
from __future__ import annotations

import dataclasses
import math
import operator
import re
from dataclasses import dataclass
from typing import Sequence

from kvbench.judge.paired import (
    LEVEL, PER_SAMPLE, SEPARATION_LEVEL, compare_paired, differences, paired_interval,
)
from kvbench.results import ClaimResult, Metric

OPS = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
    "==": operator.eq, "!=": operator.ne,
}
RELATIONS = {"/": operator.truediv, "-": operator.sub}
NOT_SEPARATED = "~"  # `metric ~ LABEL`: the paired sign test does not separate the two
# The bound of the paired interval a difference claim is judged on, by op.
PAIRED_BOUNDS = {">=": "low", ">": "low", "<=": "high", "<": "high"}
_CLAIM = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?:([/-])\s*([\w.+-]+)\s*)?"
                    r"(>=|<=|==|!=|>|<)\s*([^\s(]+)\s*(\(paired\))?\s*$")
_NOT_SEPARATED = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*~\s*([\w.+-]+)\s*$")
FORMS = ("'metric op value', 'metric / LABEL op value', 'metric - LABEL op value' (with"
         " '(paired)': judged on the paired interval or not at all) or 'metric ~ LABEL' (not"
         " separated by the paired sign test)")


@dataclass(frozen=True)
class Claim:
    text: str
    metric: str
    op: str
    target: float
    source: str = ""  # "file:line" where it was stated
    # Another case's metric this one is set against: the method label, and "/" or "-".
    reference: str | None = None
    relation: str | None = None  # "/", "-", or NOT_SEPARATED
    goal: str | None = None  # a goal not met yet, and why: its failure does not fail the run
    paired: bool = False  # judged on the cases' per-sample pairs, or missing without them
    model: str | None = None  # the model its target was calibrated on; None: any model
    skipped: str | None = None  # why a case does not judge it (it runs another model)

    def on_model(self, model: str | None) -> "Claim":
        """This claim as a case that runs `model` judges it: skipped, with the reason, where it
        was calibrated on another model."""
        if self.model is None or same_model(self.model, model):
            return self
        return dataclasses.replace(
            self, skipped=f"calibrated on {self.model}; this case runs {model or 'no model'}")

    def reference_id(self, case_id: str, benchmark: str, label: str) -> str:
        """The id of the case this claim compares `case_id` (which ran method `label`) with."""
        rest = case_id[len(benchmark) + 1 + len(label):]
        return f"{benchmark}/{self.reference}{rest}"


def same_model(calibrated: str, runs: str | None) -> bool:
    """Whether a case running `runs` runs the model a claim was calibrated on: the same spec,
    a hub model at any revision (`Org/Name@rev`) included."""
    if runs is None:
        return False
    return calibrated == runs or calibrated.partition("@")[0] == runs.partition("@")[0]


def parse_claim(text: str, source: str = "") -> Claim:
    """Parse "cosine >= 0.99", "peak_bytes / identity <= 0.51", "score - identity >= -5
    (paired)" or "score ~ identity"; raise ValueError with the expected forms otherwise."""
    apart = _NOT_SEPARATED.match(str(text))
    if apart:
        metric, reference = apart.groups()
        # held when the sign test's p is at least the separation level
        _check_per_sample(text, metric)
        return Claim(text=f"{metric} ~ {reference}", metric=metric, op=">=",
                     target=SEPARATION_LEVEL, source=source, reference=reference,
                     relation=NOT_SEPARATED, paired=True)
    match = _CLAIM.match(str(text))
    if not match:
        raise ValueError(f"claim {text!r} is not of the form {FORMS}; op one of"
                         f" {' '.join(OPS)}")
    metric, relation, reference, op, raw, paired = match.groups()
    if paired and relation != "-":
        raise ValueError(f"claim {text!r}: '(paired)' judges a difference ('metric - LABEL op"
                         " value') on the per-sample pairs")
    if paired:
        _check_per_sample(text, metric)
    try:
        target = float(raw)
    except ValueError:
        raise ValueError(f"claim {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(target):
        raise ValueError(f"claim {text!r}: the target must be a finite number")
    return Claim(text=" ".join(g for g in match.groups() if g is not None), metric=metric,
                 op=op, target=target, source=source, reference=reference, relation=relation,
                 paired=bool(paired))


def _check_per_sample(text: str, metric: str) -> None:
    if metric not in PER_SAMPLE:
        raise ValueError(f"claim {text!r} is judged on per-sample values, which cases record for"
                         f" {', '.join(PER_SAMPLE)} only, not {metric!r}")


def judge(claim: Claim, metrics: dict[str, Metric],
          reference: dict[str, Metric] | None = None, reference_id: str | None = None,
          pairs: tuple[Sequence[float], Sequence[float]] | None = None) -> ClaimResult:
    """held / failed (unmet for a goal), or missing when the case (or, for a claim against
    another case, that case: `reference`, None when it did not run or failed) did not report
    the metric. A NaN or infinite measurement fails every claim: `perplexity >= 1` must not
    hold for a diverged run. `pairs`: both cases' per-sample values of the metric on the same
    samples (this case's first), when they recorded them; a difference claim is then judged on
    a paired bound. A claim the case skips (it runs another model than the claim's) is
    `skipped`, its reason in `measured_as`."""
    if claim.skipped:
        return ClaimResult(
            claim=claim.text, metric=claim.metric, op=claim.op, target=claim.target,
            measured=None, verdict="skipped", source=claim.source, reference=reference_id,
            measured_as=claim.skipped, goal=claim.goal)
    metric = metrics.get(claim.metric)
    measured = None if metric is None else metric.value
    measured_as = None
    if claim.reference is not None:
        other = (reference or {}).get(claim.metric)
        bound = PAIRED_BOUNDS.get(claim.op) if claim.relation == "-" else None
        if measured is None or other is None:
            measured = None
        elif claim.paired and not pairs:
            measured = None
            measured_as = "no per-sample values of both cases on the same samples"
        elif claim.relation == NOT_SEPARATED:
            compared = compare_paired(*pairs)
            measured = compared.p_value
            measured_as = (f"sign test p over {compared.pairs} samples ({compared.wins} above,"
                           f" {compared.losses} below): {compared.verdict}")
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
