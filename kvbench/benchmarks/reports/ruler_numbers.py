"""ruler's numbers, made from results alone: per method and context length, the mean score over
the tasks it ran with a pooled 95% Wilson interval, and its per-sample scores paired with
`identity`'s over the cells both ran on the same samples. The ruler section and figure
(kvbench.benchmarks.reports.ruler) are drawn from them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvbench.judge.intervals import wilson_interval
from kvbench.judge.paired import per_sample
from kvbench.reportkit.paired import IDENTITY, IdentityReferences, Pair
from kvbench.reportkit.tables import finite_metric, ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "ruler"
# Bench params that place a ruler case in the grid; any other that varies splits a method's row.
_GRID_PARAMS = ("task", "length")
# Bench params that do not change which samples a case draws: identity's answers pair with a
# method's over every other param equal (data_seed, samples, essay, ...).
UNPAIRED_PARAMS = ("compress", "reads")


def samples_of(case: CaseResult) -> int:
    """How many samples the case's score is the mean of: its per-sample scores, else the
    requested count."""
    scores = per_sample(case)
    if scores is not None:
        return len(scores)
    try:
        return max(int(case.bench_params.get("samples", 0)), 0)
    except (TypeError, ValueError):
        return 0


def _extras(cases: list[CaseResult]) -> list[str]:
    """Settings besides task and length (compress, the model, ...) that differ between cases of
    one method label at one task and length: they split its row, since its cells would
    otherwise mix them. A setting that only differs between tasks (samples, say) does not."""
    def settings(case: CaseResult) -> dict[str, Any]:
        shown = {k: v for k, v in case.bench_params.items() if k not in _GRID_PARAMS}
        if case.model:
            shown["model"] = case.model
        return shown

    cells: dict[tuple, list[dict[str, Any]]] = {}
    for case in cases:
        cells.setdefault((case.method_label, task_of(case), length_of(case)), []).append(
            settings(case))
    keys = list(dict.fromkeys(k for cell in cells.values() for s in cell for k in s))
    return [k for k in keys
            if any(len({repr(s.get(k)) for s in cell}) > 1 for cell in cells.values())]


def _setting(case: CaseResult, key: str) -> Any:
    return case.model if key == "model" else case.bench_params.get(key)


def row_name(case: CaseResult, extras: list[str]) -> str:
    if not extras:
        return case.method_label
    shown = ", ".join(f"{k}={_setting(case, k)}" for k in extras)
    return f"{case.method_label} ({shown})"


@dataclass
class Headline:
    """One method row at one length: the mean over the tasks it ran there, pooled interval, and
    its per-sample scores paired with identity's over the tasks both ran on the same samples."""

    tasks: list[str]
    mean: float
    low: float
    high: float
    samples: int
    pairs: list[tuple[str, Pair]] = field(default_factory=list)  # (task, its pair) in task order
    unpaired_tasks: list[str] = field(default_factory=list)  # identity ran other samples there
    ratio: float | None = None  # mean compression_ratio of these cases

    @property
    def delta_tasks(self) -> list[str]:
        return [task for task, _ in self.pairs]

    @property
    def delta(self) -> float | None:
        """The mean per-sample difference from identity; None: nothing paired (or identity)."""
        return _mean([a - b for _, (mine, theirs) in self.pairs for a, b in zip(mine, theirs)])


@dataclass
class RulerRow:
    name: str  # the method label (and any setting that splits it)
    method: str  # the registry name
    is_identity: bool
    cases: list[CaseResult]
    headline: dict[int, Headline] = field(default_factory=dict)  # by length

    @property
    def ratio(self) -> float | None:
        return _mean([r for r in (finite_metric(c, "compression_ratio") for c in self.cases)
                      if r is not None])


@dataclass
class RulerTable:
    rows: list[RulerRow]
    lengths: list[int]
    tasks: list[str]  # in order of first appearance
    extras: list[str]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def length_of(case: CaseResult) -> int:
    return int(case.bench_params.get("length", 0))


def task_of(case: CaseResult) -> str:
    return str(case.bench_params.get("task", "?"))


def ruler_table(result: RunResult) -> RulerTable | None:
    """The numbers of the ruler section and figure; None when the run has no ok ruler case
    with a score."""
    cases = [c for c in ok_cases(result, BENCHMARK) if finite_metric(c, "score") is not None]
    if not cases:
        return None
    extras = _extras(cases)
    rows: dict[str, RulerRow] = {}
    for case in cases:
        name = row_name(case, extras)
        row = rows.setdefault(name, RulerRow(name, case.method, case.method == IDENTITY, []))
        row.cases.append(case)
    ordered = ([r for r in rows.values() if r.is_identity]
               + [r for r in rows.values() if not r.is_identity])
    # The reference of each (model, task, length, seed, samples) cell: the first identity case.
    references = IdentityReferences((case for row in ordered if row.is_identity
                                     for case in row.cases), UNPAIRED_PARAMS)
    lengths = sorted({length_of(c) for c in cases})
    for row in ordered:
        for length in lengths:
            here = [c for c in row.cases if length_of(c) == length]
            if here:
                row.headline[length] = _headline(row, here, references)
    return RulerTable(ordered, lengths, list(dict.fromkeys(task_of(c) for c in cases)), extras)


def _headline(row: RulerRow, cases: list[CaseResult],
              references: IdentityReferences) -> Headline:
    samples = sum(samples_of(c) for c in cases)
    # weighted by samples: cases sampled to a precision answered different numbers of them
    mean = (sum(finite_metric(c, "score") * samples_of(c) for c in cases) / samples if samples
            else sum(finite_metric(c, "score") for c in cases) / len(cases))
    low, high = wilson_interval(mean, samples) if samples else (math.nan, math.nan)
    ratios = [r for r in (finite_metric(c, "compression_ratio") for c in cases) if r is not None]
    head = Headline([task_of(c) for c in cases], mean, low, high, samples, ratio=_mean(ratios))
    if row.is_identity:
        return head
    for case, pair in references.scored(cases):
        if pair is None:
            head.unpaired_tasks.append(task_of(case))
        else:
            head.pairs.append((task_of(case), pair))
    return head
