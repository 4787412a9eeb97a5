"""A stress run's cases as lines: per method (and setting that differs), its cases by users."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.reportkit.tables import ok_cases
from kvbench.results import CaseResult, RunResult

BENCHMARK = "stress"
NO_TASK = "none"
_GRID_PARAM = "users"


@dataclass
class StressTable:
    """Each line (a method label, split by any other setting that differs between its cases):
    its cases by users."""

    lines: dict[str, dict[int, CaseResult]] = field(default_factory=dict)

    @property
    def users(self) -> list[int]:
        return sorted({n for cases in self.lines.values() for n in cases})


def _users(case: CaseResult) -> int:
    return int(case.bench_params.get(_GRID_PARAM, 1))


def task_of(case: CaseResult) -> str | None:
    """The RULER task whose samples the case sent; None for free text."""
    task = case.bench_params.get("task")
    return None if task in (None, NO_TASK) else str(task)


def _setting(case: CaseResult) -> tuple:
    return (case.model, *sorted((k, repr(v)) for k, v in case.bench_params.items()
                                if k != _GRID_PARAM))


def stress_table(result: RunResult) -> StressTable | None:
    cases = ok_cases(result, BENCHMARK)
    if not cases:
        return None
    settings: dict[str, list[tuple]] = {}
    for case in cases:
        seen = settings.setdefault(case.method_label, [])
        if _setting(case) not in seen:
            seen.append(_setting(case))
    table = StressTable()
    for case in cases:
        name = case.method_label
        if len(settings[name]) > 1:  # the same method under two settings: two lines
            name += f" ({_differing(case, cases)})"
        table.lines.setdefault(name, {})[_users(case)] = case
    return table


def _differing(case: CaseResult, cases: list[CaseResult]) -> str:
    """The bench params (and model) that differ between this method label's cases, as set in
    `case`."""
    mine = [c for c in cases if c.method_label == case.method_label]
    keys = sorted({k for c in mine for k in c.bench_params if k != _GRID_PARAM})
    differing = [k for k in keys if len({repr(c.bench_params.get(k)) for c in mine}) > 1]
    parts = [f"{k}={short(case.bench_params.get(k))}" for k in differing]
    if len({c.model for c in mine}) > 1:
        parts.insert(0, f"model={case.model}")
    return ", ".join(parts) or "?"


def short(value: Any) -> str:
    return value.get("url", str(value)) if isinstance(value, dict) else str(value)


def task_lines(table: StressTable) -> dict[str, dict[int, CaseResult]]:
    """The table's lines, each with its levels that sent task samples; lines without any left
    out."""
    lines = {name: {n: case for n, case in cases.items() if task_of(case)}
             for name, cases in table.lines.items()}
    return {name: cases for name, cases in lines.items() if cases}
