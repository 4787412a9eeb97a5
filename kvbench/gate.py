"""Compare a run with a baseline: per metric, its direction and tolerance decide the verdict.

Reads result records only (no runner, no suite loader), so a gate can be re-run from two JSON files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from kvbench.results import CaseResult, Metric, RunResult
from kvbench.tolerance import DEFAULT_TOLERANCE, Tolerance

# Fewer repeats than this give no spread to test, so the tolerance alone decides.
MIN_SAMPLES_FOR_SPREAD = 2

RowVerdict = Literal[
    "regression", "improvement", "same", "not significant", "not gated",
    "not comparable", "missing", "new", "error",
]


def tolerances_from_resolved(resolved_suite: dict[str, Any]) -> tuple[Tolerance, dict[str, Tolerance]]:
    """The suite's `gate:` block as stored in RunResult.suite.resolved -> (default, per metric)."""
    block = resolved_suite.get("gate") or {}
    default_spec = block.get("default")
    default = _tolerance(default_spec) if default_spec else DEFAULT_TOLERANCE
    per_metric = {name: _tolerance(spec) for name, spec in (block.get("metrics") or {}).items()}
    return default, per_metric


def _tolerance(spec: dict[str, Any]) -> Tolerance:
    return Tolerance(abs=spec.get("abs"), rel=spec.get("rel"))


@dataclass
class GateRow:
    case_id: str
    metric: str
    unit: str
    direction: str
    baseline: float | None
    current: float | None
    ratio: float | None  # current / baseline; None when either is absent or baseline is 0
    verdict: RowVerdict


@dataclass
class GateReport:
    comparable: bool = True  # run level: schema, machine key, suite name
    rows: list[GateRow] = field(default_factory=list)
    regressions: list[GateRow] = field(default_factory=list)
    improvements: list[GateRow] = field(default_factory=list)
    missing_cases: list[str] = field(default_factory=list)
    new_cases: list[str] = field(default_factory=list)
    failed_cases: list[str] = field(default_factory=list)  # status not ok in the current run
    not_comparable_cases: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    expect_all: bool = True  # missing cases count as regressions

    def regressed(self) -> bool:
        lost = self.failed_cases or (self.expect_all and self.missing_cases)
        return bool(self.regressions or lost)

    def exit_code(self) -> int:
        if not self.comparable or self.not_comparable_cases:
            return 4
        return 1 if self.regressed() else 0


def gate(
    current: RunResult,
    baseline: RunResult,
    default: Tolerance,
    per_metric: dict[str, Tolerance],
    expect_all: bool = True,
) -> GateReport:
    """Judge every metric of `current` against `baseline`.

    expect_all: the current run was not filtered, so a case (or metric) that the baseline has and
    this run lacks counts as a regression: CI notices a dropped case.
    """
    report = GateReport(expect_all=expect_all)
    _check_run_level(current, baseline, report)
    now = {case.id: case for case in current.cases}
    before = {case.id: case for case in baseline.cases}

    for case_id, old in before.items():
        new = now.get(case_id)
        if new is None:
            report.missing_cases.append(case_id)
            _add(report, [_row(case_id, name, m, None, "missing") for name, m in old.metrics.items()])
        else:
            _compare_case(old, new, default, per_metric, expect_all, report)
    for case_id, new in now.items():
        if case_id not in before:
            report.new_cases.append(case_id)
            _add(report, [_row(case_id, name, None, m, "new") for name, m in new.metrics.items()])
    return report


def _check_run_level(current: RunResult, baseline: RunResult, report: GateReport) -> None:
    checks = [
        ("schema_version", current.schema_version, baseline.schema_version),
        ("machine key", current.machine.get("key"), baseline.machine.get("key")),
        ("suite name", current.suite.name, baseline.suite.name),
    ]
    for what, now, before in checks:
        if now != before:
            report.comparable = False
            report.reasons.append(f"{what} differs: baseline {before!r}, current {now!r}")


def _compare_case(
    old: CaseResult, new: CaseResult, default: Tolerance, per_metric: dict[str, Tolerance],
    expect_all: bool, report: GateReport,
) -> None:
    case_id = new.id
    if new.status != "ok" or old.status != "ok":
        if new.status != "ok":
            report.failed_cases.append(case_id)
        report.reasons.append(f"{case_id}: status {new.status} (baseline {old.status})")
        _add(report, _rows_of_both(old, new, "error"))
        return
    mismatched = sorted(k for k in old.comparable.keys() | new.comparable.keys()
                        if old.comparable.get(k) != new.comparable.get(k))
    if mismatched:
        report.not_comparable_cases.append(case_id)
        for key in mismatched:
            report.reasons.append(
                f"{case_id}: {key} differs: baseline {old.comparable.get(key)!r}, "
                f"current {new.comparable.get(key)!r}"
            )
        _add(report, _rows_of_both(old, new, "not comparable"))
        return

    for name, before in old.metrics.items():
        now = new.metrics.get(name)
        if now is None:
            _add(report, [_row(case_id, name, before, None, "missing")], regression=expect_all)
        elif now.unit != before.unit:
            report.not_comparable_cases.append(case_id)
            report.reasons.append(f"{case_id}: {name} unit {before.unit!r} became {now.unit!r}")
            _add(report, [_row(case_id, name, before, now, "not comparable")])
        else:
            verdict = judge_metric(before, now, per_metric.get(name, default))
            _add(report, [_row(case_id, name, before, now, verdict)])
    for name, now in new.metrics.items():
        if name not in old.metrics:
            _add(report, [_row(case_id, name, None, now, "new")])


def judge_metric(before: Metric, now: Metric, tolerance: Tolerance) -> RowVerdict:
    """regression / improvement / same / not significant / not gated for one metric."""
    direction = now.direction
    if direction == "none":
        return "not gated"
    if math.isnan(now.value) or math.isnan(before.value):
        # A number that became NaN (a diverged perplexity, say) is worse; nothing else can be judged.
        return "not gated" if math.isnan(before.value) else "regression"
    delta = now.value - before.value
    worse = delta > 0 if direction == "lower" else delta < 0
    if abs(delta) <= tolerance.allowed(before.value):
        return "same"
    if not _spreads_apart(before, now):
        return "not significant"
    return "regression" if worse else "improvement"


def _spreads_apart(before: Metric, now: Metric) -> bool:
    """Timed metrics move only when every repeat of one side lies beyond every repeat of the other."""
    a, b = before.samples or [], now.samples or []
    if len(a) < MIN_SAMPLES_FOR_SPREAD or len(b) < MIN_SAMPLES_FOR_SPREAD:
        return True
    return min(b) > max(a) or max(b) < min(a)


def _row(case_id: str, name: str, before: Metric | None, now: Metric | None, verdict: RowVerdict) -> GateRow:
    shown = now or before
    old_value = None if before is None else before.value
    new_value = None if now is None else now.value
    ratio = new_value / old_value if old_value and new_value is not None else None
    return GateRow(case_id, name, shown.unit, shown.direction, old_value, new_value, ratio, verdict)


def _rows_of_both(old: CaseResult, new: CaseResult, verdict: RowVerdict) -> list[GateRow]:
    names = list(old.metrics) + [n for n in new.metrics if n not in old.metrics]
    return [_row(new.id, n, old.metrics.get(n), new.metrics.get(n), verdict) for n in names]


def _add(report: GateReport, rows: list[GateRow], regression: bool = False) -> None:
    report.rows.extend(rows)
    for row in rows:
        if regression or row.verdict == "regression":
            report.regressions.append(row)
        elif row.verdict == "improvement":
            report.improvements.append(row)
