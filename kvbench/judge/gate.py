"""Compare a run with a baseline: per metric, its kind, direction and tolerance decide.

Each row names the rule that judged it:
- tolerance: a figure the same inputs reproduce (bytes, errors, perplexity) is a regression when
  it moved beyond its tolerance in its worse direction.
- same-run ratio: a timing divided by a reference timed in the same repeat (a copy of the same
  bytes, the plain cache) moves only when its median moved beyond its tolerance AND its samples
  moved significantly (Mann-Whitney U, one-sided, p < SIGNIFICANCE): noise on a shared machine
  has to beat both.
- absolute timing: shown, not gated, unless the suite's gate sets absolute_timings; then judged
  as a ratio is.
- per sample: where both records hold a metric's per-sample values on the same samples (RULER's,
  NIAH's scores), the paired sign test against the baseline's own samples
  (kvbench.judge.per_sample): samples that got significantly worse are a regression even when
  the mean stayed inside its tolerance, and the gate lists them.
A case defined otherwise than the baseline's (another method setting, benchmark setting,
model, data, backend) is not comparable: never a regression, never an improvement; the rest are
still gated, and only a strict gate exits 4 for it.

Reads result records only (no runner, no suite loader, no torch), so a gate can be re-run from
two JSON files.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvbench.results import CaseResult, Metric, RunResult, defining_parts, fingerprint
from kvbench.judge.per_sample import SampleShift, sample_shifts
from kvbench.judge.significance import shift_p_value, smallest_p_value
from kvbench.judge.tolerance import DEFAULT_TOLERANCE, Tolerance

SIGNIFICANCE = 0.01  # one-sided Mann-Whitney level a timing's move must reach

RowVerdict = Literal[
    "regression", "improvement", "same", "not significant", "not gated",
    "not comparable", "missing", "new", "error",
]


@dataclass(frozen=True)
class GatePolicy:
    """A suite's `gate:` block: tolerances and whether absolute timings are gated."""

    default: Tolerance = DEFAULT_TOLERANCE
    per_metric: Mapping[str, Tolerance] = field(default_factory=dict)
    absolute_timings: bool = False

    @classmethod
    def from_resolved(cls, resolved_suite: dict[str, Any]) -> "GatePolicy":
        """From the suite as stored in RunResult.suite.resolved."""
        block = resolved_suite.get("gate") or {}
        default_spec = block.get("default")
        return cls(
            default=_tolerance(default_spec) if default_spec else DEFAULT_TOLERANCE,
            per_metric={name: _tolerance(spec)
                        for name, spec in (block.get("metrics") or {}).items()},
            absolute_timings=bool(block.get("absolute_timings", False)),
        )

    def tolerance(self, metric: str) -> Tolerance:
        return self.per_metric.get(metric, self.default)


def _tolerance(spec: dict[str, Any]) -> Tolerance:
    return Tolerance(abs=spec.get("abs"), rel=spec.get("rel"))


def policies_of(current: RunResult, baseline: RunResult) -> list[GatePolicy]:
    """Both runs' stored gate settings: each metric gets the stricter of the two, so a change
    to a suite cannot loosen the gate it is judged by."""
    return [GatePolicy.from_resolved(baseline.suite.resolved),
            GatePolicy.from_resolved(current.suite.resolved)]


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
    rule: str = ""  # what judged it: "tolerance rel 0.02", "same-run ratio: ... p=0.004", ...


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
    sample_shifts: list[SampleShift] = field(default_factory=list)  # per-sample comparisons
    expect_all: bool = True  # missing cases count as regressions
    strict: bool = False  # a case not comparable exits 4 (else it is marked, and the rest gated)

    def regressed(self) -> bool:
        lost = self.failed_cases or (self.expect_all and self.missing_cases)
        return bool(self.regressions or lost)

    def exit_code(self) -> int:
        if not self.comparable or (self.strict and self.not_comparable_cases):
            return 4
        return 1 if self.regressed() else 0


def gate(
    current: RunResult,
    baseline: RunResult,
    policies: Sequence[GatePolicy] | None = None,
    expect_all: bool | None = None,
    strict: bool = False,
) -> GateReport:
    """Judge every metric of `current` against `baseline`.

    policies: the gate settings that apply; each metric gets the strictest. Default: both runs'
    stored suites (policies_of).
    expect_all: a case (or metric) that the baseline has and this run lacks counts as a
    regression: CI notices a dropped case. Default: unless the run says it was a subset (its
    filters or shard, RunResult.is_subset), so a run and a later gate of its file agree.
    strict: a case not comparable makes the gate exit 4.
    """
    policies = list(policies or policies_of(current, baseline))
    if expect_all is None:
        expect_all = not current.is_subset()
    report = GateReport(expect_all=expect_all, strict=strict)
    _check_run_level(current, baseline, report)
    now = {case.id: case for case in current.cases}
    before = {case.id: case for case in baseline.cases}

    for case_id, old in before.items():
        new = now.get(case_id)
        if new is None:
            report.missing_cases.append(case_id)
            _add(report, [_row(case_id, name, m, None, "missing") for name, m in old.metrics.items()])
        else:
            _compare_case(old, new, policies, expect_all, report)
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
    # a plug-in's code is judged as kvbench's own is, but said: its changes explain the rows.
    # One that only one run loaded (a subset that needed none of its methods) changed nothing.
    for module in sorted(current.plugins.keys() & baseline.plugins.keys()):
        before, now = baseline.plugins[module], current.plugins[module]
        if before != now:
            report.reasons.append(f"plug-in {module} changed: {_code(before)} in the baseline,"
                                  f" {_code(now)} now")


def _code(entry: dict[str, str]) -> str:
    parts = [f"{entry['distribution']} {entry['version']}"] if "distribution" in entry else []
    return ", ".join(parts + [f"source sha256 {entry.get('sha256', '?')[:12]}"])


def _compare_case(old: CaseResult, new: CaseResult, policies: Sequence[GatePolicy],
                  expect_all: bool, report: GateReport) -> None:
    case_id = new.id
    if new.status != "ok" or old.status != "ok":
        if new.status != "ok":
            report.failed_cases.append(case_id)
        report.reasons.append(f"{case_id}: status {new.status} (baseline {old.status})")
        _add(report, _rows_of_both(old, new, "error"))
        return
    differences = fingerprint_differences(old, new)
    if differences:
        report.not_comparable_cases.append(case_id)
        report.reasons.append(f"{case_id}: not comparable, its definition differs: "
                              + "; ".join(differences))
        _add(report, _rows_of_both(old, new, "not comparable"))
        return

    absolute_timings = any(p.absolute_timings for p in policies)
    for name, before in old.metrics.items():
        now = new.metrics.get(name)
        if now is None:
            _add(report, [_row(case_id, name, before, None, "missing")], regression=expect_all)
        elif now.unit != before.unit:
            report.not_comparable_cases.append(case_id)
            report.reasons.append(f"{case_id}: {name} unit {before.unit!r} became {now.unit!r}")
            _add(report, [_row(case_id, name, before, now, "not comparable")])
        else:
            tolerance = min((p.tolerance(name) for p in policies),
                            key=lambda t: t.allowed(before.value))
            verdict, rule = judge_metric(before, now, tolerance, absolute_timings)
            _add(report, [_row(case_id, name, before, now, verdict, rule)])
    for name, now in new.metrics.items():
        if name not in old.metrics:
            _add(report, [_row(case_id, name, None, now, "new")])
    # timings move with the machine: only figures the same inputs reproduce are paired
    directions = {name: m.direction for name, m in new.metrics.items()
                  if m.direction != "none" and m.timing is None}
    for shift in sample_shifts(old, new, directions):
        report.sample_shifts.append(shift)
        verdict = PER_SAMPLE_VERDICTS[shift.comparison.verdict]
        _add(report, [_row(case_id, f"{shift.metric} per sample", old.metrics[shift.metric],
                           new.metrics[shift.metric], verdict, shift.rule)])


PER_SAMPLE_VERDICTS: dict[str, RowVerdict] = {
    "worse": "regression", "better": "improvement", "not separated": "same"}


def fingerprint_differences(old: CaseResult, new: CaseResult) -> list[str]:
    """What makes two results of one case id not comparable, as "key: before -> after"; empty
    when they define the same case. The records' fields are compared, not their fingerprints:
    a setting added to kvbench since the baseline, left unset (None), defines nothing new, so
    it matches its absence. A baseline record whose stored fingerprint is not that of its own
    fields was edited by hand (one written before schema 2 has none)."""
    before, after = _flatten(defining_parts(old)), _flatten(defining_parts(new))
    changed = [f"{key}: {_shown(before, key)} -> {_shown(after, key)}"
               for key in sorted(before.keys() | after.keys())
               if before.get(key) != after.get(key)]
    if not changed and old.fingerprint and old.fingerprint != fingerprint(old):
        changed = ["the baseline record's stored fingerprint is not that of its fields "
                   "(edited by hand?)"]
    return changed


def _shown(parts: dict[str, Any], key: str) -> str:
    return repr(parts[key]) if key in parts else "(absent)"


def _flatten(parts: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parts.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def judge_metric(before: Metric, now: Metric, tolerance: Tolerance,
                 absolute_timings: bool = False) -> tuple[RowVerdict, str]:
    """(verdict, the rule that gave it) for one metric; see the module docstring."""
    if now.direction == "none":
        return "not gated", "no better direction"
    if not math.isfinite(before.value):
        return "not gated", "the baseline value is not finite"
    if not math.isfinite(now.value):
        return "regression", "not finite (a diverged or failed measurement)"
    if now.timing == "absolute" and not absolute_timings:
        return "not gated", ("absolute timing: gated through its same-run ratio "
                             "(gate.absolute_timings: true gates it too)")
    delta = now.value - before.value
    worse = delta > 0 if now.direction == "lower" else delta < 0
    moved = "regression" if worse else "improvement"
    kind = {None: "tolerance", "ratio": "same-run ratio", "absolute": "absolute timing"}[now.timing]
    if abs(delta) <= tolerance.allowed(before.value):
        return "same", f"{kind}: within {tolerance}"
    if now.timing is None:
        return moved, f"{kind}: beyond {tolerance}"
    a, b = before.samples or [before.value], now.samples or [now.value]
    if smallest_p_value(len(a), len(b)) >= SIGNIFICANCE:
        return "not significant", (f"{kind}: beyond {tolerance}, but {len(a)} and {len(b)} "
                                   f"samples cannot reach p < {SIGNIFICANCE:g}")
    p = shift_p_value(a, b, larger=delta > 0)
    if p >= SIGNIFICANCE:
        return "not significant", f"{kind}: beyond {tolerance}, Mann-Whitney p = {p:.2g}"
    return moved, f"{kind}: beyond {tolerance} and Mann-Whitney p = {p:.2g}"


def _row(case_id: str, name: str, before: Metric | None, now: Metric | None,
         verdict: RowVerdict, rule: str = "") -> GateRow:
    shown = now or before
    old_value = None if before is None else before.value
    new_value = None if now is None else now.value
    ratio = new_value / old_value if old_value and new_value is not None else None
    rule = rule or _UNJUDGED.get(verdict, "")
    return GateRow(case_id, name, shown.unit, shown.direction, old_value, new_value, ratio,
                   verdict, rule)


_UNJUDGED = {
    "missing": "absent from the current run", "new": "absent from the baseline",
    "error": "the case did not finish ok", "not comparable": "the case's definition differs",
}


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
