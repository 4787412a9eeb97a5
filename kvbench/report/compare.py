"""Two runs side by side, marked like asv compare; the verdicts come from the gate."""
from __future__ import annotations

from collections import Counter

from kvbench.judge.gate import GateReport, gate
from kvbench.report.flipped import flipped_section
from kvbench.reportkit.tables import (
    fmt_number, fmt_ratio, md_table, metric_cell, metric_header,
)
from kvbench.results import Metric, RunResult

# Fingerprint keys worth seeing next to each other; the full fingerprint is in each report.
SIDE_FIELDS = ("cpu", "cores", "memory", "gpu", "device", "backend", "os", "python", "torch",
               "mlx", "mlx_blas")

MARKS = {
    "regression": "worse", "improvement": "better",
    "same": "~", "not significant": "~", "not gated": "",
    "not comparable": "x", "missing": "x", "new": "x", "error": "x",
}
LEGEND = (
    "<sub>worse / better: moved beyond the tolerance (same-run timing ratios: and significantly, "
    "Mann-Whitney p < 0.01 over their samples) · ~: within tolerance or not significant · "
    "x: not comparable (missing on one side, another definition of the case, or the case did not "
    "run ok) · blank: not gated (no better direction, or an absolute timing) · timed metrics: "
    "median ± IQR/2 · the rule column says what judged each row</sub>"
)


def render_compare(a: RunResult, b: RunResult, report: GateReport | None = None) -> str:
    """B judged against A (`report`, default: the gate with the stricter of their suites'
    settings); a compare is often across machines, so run-level differences are notes."""
    report = report or gate(b, a, expect_all=False)
    names = a.suite.name if a.suite.name == b.suite.name else f"{a.suite.name} vs {b.suite.name}"
    parts = [f"# kvbench compare: {names}", _sides(a, b),
             _table(a, b, report), _summary(report),
             flipped_section(report, "## Samples worse in B than in A")]
    return "\n\n".join(part for part in parts if part) + "\n"


def _sides(a: RunResult, b: RunResult) -> str:
    fields = [f for f in SIDE_FIELDS if f in a.machine or f in b.machine]
    rows = [
        ["suite", a.suite.name, b.suite.name],
        ["machine key", a.machine.get("key", ""), b.machine.get("key", "")],
        *[[f, _text(a.machine.get(f)), _text(b.machine.get(f))] for f in fields],
        ["git sha", (a.git_sha or "")[:12], (b.git_sha or "")[:12]],
        ["kvbench", a.kvbench_version, b.kvbench_version],
        ["started", a.started, b.started],
    ]
    return md_table(["", "A", "B"], rows)


def _table(a: RunResult, b: RunResult, report: GateReport) -> str:
    metrics_a, metrics_b = _metrics(a), _metrics(b)
    rows = []
    for row in report.rows:
        key = (row.case_id, row.metric)
        shown_a, shown_b = metrics_a.get(key), metrics_b.get(key)
        rows.append([
            MARKS[row.verdict], row.case_id, metric_header(row.metric, row.unit, row.direction),
            metric_cell(shown_a) if shown_a else fmt_number(row.baseline, row.unit),
            metric_cell(shown_b) if shown_b else fmt_number(row.current, row.unit),
            fmt_ratio(row.ratio), row.rule,
        ])
    if not rows:
        return "No metrics to compare."
    return md_table(["mark", "case", "metric", "A", "B", "B/A", "rule"], rows, right={3, 4, 5})


def _summary(report: GateReport) -> str:
    counts = Counter(MARKS[row.verdict] for row in report.rows)
    line = " · ".join(f"{counts[mark]} {mark}" for mark in ("worse", "better", "~", "x"))
    notes = "\n".join(f"- {reason}" for reason in report.reasons)
    return "\n\n".join(part for part in (line, LEGEND, notes) if part)


def _metrics(result: RunResult) -> dict[tuple[str, str], Metric]:
    return {(c.id, name): m for c in result.cases for name, m in c.metrics.items()}


def _text(value) -> str:
    return "" if value is None else str(value)
