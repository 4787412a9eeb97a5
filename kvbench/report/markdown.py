"""The Markdown report of one run, made from its results file alone (no time, no re-run)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from kvbench.benchmarks import BENCHMARKS
from kvbench.judge.claims import NOT_SEPARATED, parse_claim
from kvbench.judge.gate import GateReport, GateRow
from kvbench.report.flipped import flipped_section
from kvbench.reportkit.benchmark import BenchmarkReport
from kvbench.reportkit.footprint import footprint_section
from kvbench.reportkit.tables import (
    benchmark_table, by_benchmark, fmt_number, fmt_ratio, md_table, method_table, own_metrics,
)
from kvbench.files import atomic_write_text
from kvbench.results import CaseResult, RunResult

STATUSES = ("ok", "error", "timeout", "refused")
VERDICT_MARKS = {"held": "✅ held", "failed": "❌ failed", "missing": "⚠ missing",
                 "unmet": "◻ goal not met", "skipped": "⏭ skipped"}
GENERIC_REPORT = BenchmarkReport()  # a benchmark's table alone


def render_markdown(result: RunResult, gate: GateReport | None = None,
                    out_dir: Path | None = None) -> str:
    """The report; with out_dir, the benchmarks' figures are written there as well."""
    parts = [f"# kvbench: {result.suite.name}", _run_lines(result)]
    groups = by_benchmark(result.cases)
    reports = {benchmark: benchmark_report(benchmark) for benchmark in groups}
    for benchmark, cases in groups.items():
        table = benchmark_table(cases, reports[benchmark].row, own_metrics(cases))
        parts.append(f"## {benchmark}\n\n{table}")
        # what the benchmark adds below its table: summaries and figures (written to out_dir
        # when given; the same text either way)
        parts += [part for part in reports[benchmark].sections(result, out_dir) if part]
    across = method_table(result.cases, {benchmark: report.headline
                                         for benchmark, report in reports.items()})
    if across:
        parts.append(f"## by method\n\nEach method's headline figures from every benchmark that"
                     f" ran it.\n\n{across}")
    footprint = footprint_section(result.cases, out_dir=out_dir)
    if footprint:
        parts.append(footprint)
    claims = claims_section(result.cases)
    if claims:
        parts.append(claims)
    warnings = [f"- `{case.id}`: {warning}" for case in result.cases for warning in case.warnings]
    if warnings:
        parts.append("## Warnings\n\n" + "\n".join(warnings))
    if gate is not None:
        parts.append(_gate_section(gate))
    parts.append(_environment_section(result.machine))
    return "\n\n".join(parts) + "\n"


def write_reports(result: RunResult, out_dir: str | Path, gate: GateReport | None = None) -> Path:
    """report.md, and beside it the figures its benchmarks' reports draw (each benchmark's own,
    when the run has cases of it to plot)."""
    path = Path(out_dir) / "report.md"
    atomic_write_text(path, render_markdown(result, gate, path.parent))
    return path


def benchmark_report(kind: str) -> BenchmarkReport:
    """The report of a case's benchmark, as its declaration gives it; the generic report for a
    kind that cannot be looked up here (a plug-in not installed where the report is made)."""
    try:
        declared = BENCHMARKS.get(kind).report
    except Exception:  # unknown here, or a plug-in that fails to import: the results suffice
        return GENERIC_REPORT
    return declared if isinstance(declared, BenchmarkReport) else GENERIC_REPORT


def _run_lines(result: RunResult) -> str:
    sha = f"git `{result.git_sha[:12]}`" if result.git_sha else "git sha unknown"
    run = [f"kvbench {result.kvbench_version}", sha, f"machine `{result.machine.get('key', '?')}`",
           f"started {result.started}", f"finished {result.finished or '—'}"]
    if result.interrupted:
        run.append("**interrupted**")
    statuses = Counter(case.status for case in result.cases)
    cases = f"{len(result.cases)} cases: " + ", ".join(f"{statuses[s]} {s}" for s in STATUSES if statuses[s])
    claims = Counter(c.verdict for case in result.cases for c in case.claims)
    if claims:
        cases += " · claims: " + ", ".join(f"{claims[v]} {v}" for v in VERDICT_MARKS if claims[v])
    suite = f"suite `{result.suite.path}` (sha256 `{result.suite.hash[:12]}`)"
    plugins = "".join(f"plug-in `{module}`" + _provenance(entry) + "  \n"
                      for module, entry in result.plugins.items())
    return " · ".join(run) + "  \n" + suite + "  \n" + plugins + cases


def _provenance(entry: dict[str, str]) -> str:
    parts = ([f"{entry['distribution']} {entry['version']}"] if "distribution" in entry else [])
    parts += [f"source sha256 `{entry['sha256'][:12]}`"] if "sha256" in entry else []
    return f" ({', '.join(parts)})" if parts else ""


def claims_section(cases: list[CaseResult], heading: str = "## Claims") -> str:
    """The cases' claims as a table under `heading`: measured, verdict (an unmet goal with its
    reason, a skipped claim with the model it was calibrated on) and where each was stated; ""
    when they have none."""
    rows = []
    for case in cases:
        for claim in case.claims:
            metric = case.metrics.get(claim.metric)
            # a ratio to another case, or a test's p-value: no unit
            unitless = parse_claim(claim.claim).relation in ("/", NOT_SEPARATED)
            unit = "" if metric is None or unitless else metric.unit
            measured = fmt_number(claim.measured, unit) or "—"
            skipped = claim.verdict == "skipped"  # its measured_as says why, in the verdict
            if claim.measured_as and not skipped:  # a paired bound or test, not the means
                measured += f" ({claim.measured_as})"
            verdict = VERDICT_MARKS[claim.verdict]
            if claim.verdict == "unmet":
                verdict += f": {claim.goal}"
            if skipped:
                verdict += f": {claim.measured_as}"
            rows.append([case.id, claim.claim, measured, verdict, claim.source])
    if not rows:
        return ""
    return f"{heading}\n\n" + md_table(["case", "claim", "measured", "verdict", "source"], rows)


def _gate_section(gate: GateReport) -> str:
    lines = ["## Gate against the baseline", ""]
    if gate.exit_code() == 4:
        lines.append("**Not comparable** with the baseline (exit 4).")
    else:
        verdict = "**regression**" if gate.regressed() else "no regression"
        lines.append(f"{verdict} (exit {gate.exit_code()}): {len(gate.regressions)} regressed "
                     f"metrics, {len(gate.improvements)} improved.")
    if gate.reasons:
        lines += [""] + [f"- {reason}" for reason in gate.reasons]
    for title, rows in (("Regressions", gate.regressions), ("Improvements", gate.improvements)):
        if rows:
            lines += ["", f"### {title}", "", _gate_rows_table(rows)]
    missing_note = " (count as regressions: the run was not filtered)" if gate.expect_all else ""
    for title, ids in ((f"Missing cases{missing_note}", gate.missing_cases),
                       ("New cases (not in the baseline)", gate.new_cases),
                       ("Not comparable cases (defined otherwise: not gated)",
                        gate.not_comparable_cases),
                       ("Failed cases", gate.failed_cases)):
        if ids:
            lines += ["", f"### {title}", ""] + [f"- `{case_id}`" for case_id in ids]
    flipped = flipped_section(gate)
    if flipped:
        lines += ["", flipped]
    if gate.rows:
        lines += ["", "<details><summary>Every metric and the rule that judged it</summary>", "",
                  _gate_rows_table(gate.rows, verdicts=True), "", "</details>"]
    return "\n".join(lines)


def _gate_rows_table(rows: list[GateRow], verdicts: bool = False) -> str:
    body = [[r.case_id, r.metric, fmt_number(r.baseline, r.unit), fmt_number(r.current, r.unit),
             fmt_ratio(r.ratio), *([r.verdict] if verdicts else []), r.rule] for r in rows]
    header = ["case", "metric", "baseline", "current", "ratio", *(["verdict"] if verdicts else []),
              "rule"]
    return md_table(header, body, right={2, 3, 4})


def _environment_section(machine: dict) -> str:
    rows = [[key, value if isinstance(value, str) else json.dumps(value, sort_keys=True)]
            for key, value in sorted(machine.items())]
    return "## Environment\n\n" + md_table(["key", "value"], rows)
