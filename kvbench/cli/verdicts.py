"""How a finished run ends on the terminal: its claims table, its summary, its exit code."""
from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import (
    EXIT_BASELINE, EXIT_CRASHED, EXIT_FAILED, EXIT_OK, console,
)


def claims_table(result) -> Table:
    table = Table(title="Claims", show_lines=False)
    for column in ("case", "claim", "measured", "verdict"):
        table.add_column(column, overflow="fold")
    style = {"held": "[green]held[/]", "failed": "[red]FAILED[/]", "missing": "[yellow]missing[/]",
             "unmet": "[yellow]goal not met[/]", "skipped": "[dim]skipped[/]"}
    for case in result.cases:
        for claim in case.claims:
            measured = "-" if claim.measured is None else f"{claim.measured:.6g}"
            verdict = style[claim.verdict]
            if claim.verdict == "skipped":  # calibrated on another model: says which
                verdict += f": {escape(claim.measured_as or '')}"
            table.add_row(escape(case.id), escape(claim.claim), measured, verdict)
    return table


# why a case was refused, by its error type, as the summary counts them
REFUSED_BECAUSE = {"LibraryMissing": "the library not installed",
                   "LayersUnsupported": "layers the method cannot run on",
                   "SettingUnfit": "a setting of the suite the model cannot hold"}


def exit_code(result, gate_report) -> int:
    if gate_report is not None and gate_report.exit_code() == EXIT_BASELINE:
        return EXIT_BASELINE
    if any(c.status not in ("ok", "refused") for c in result.cases):  # refused: reported
        return EXIT_CRASHED
    claims_ok = all(cl.verdict in ("held", "unmet", "skipped")  # neither fails the run
                    for c in result.cases for cl in c.claims)
    if not claims_ok or (gate_report is not None and gate_report.exit_code() != EXIT_OK):
        return EXIT_FAILED
    return EXIT_OK


def exit_causes(result, gate_report) -> list[str]:
    """Why exit_code() is not 0, one plain line per cause: failed claims, cases that did not
    finish, and what the gate found (run-level differences, cases not comparable or lost,
    regressions)."""
    from kvbench.reportkit.tables import fmt_number

    causes = [f"claim {claim.verdict}: {case.id}: {claim.claim} ("
              + ("nothing measured" if claim.measured is None
                 else f"measured {fmt_number(claim.measured)}") + ")"
              for case in result.cases for claim in case.claims
              if claim.verdict in ("failed", "missing")]
    return causes + [f"{kind}: {text}" for kind, text in _cases_and_gate(result, gate_report)]


def refresh_command(gate_report, results_path, baseline_path) -> str | None:
    """The command that makes this run the baseline of the cases the baseline defines otherwise
    (the rest of the baseline kept); None when there are none."""
    if gate_report is None or not gate_report.not_comparable_cases:
        return None
    return shlex.join(["kvbench", "baseline", "save", str(results_path), "--to",
                       str(baseline_path), "--cases", ",".join(gate_report.not_comparable_cases)])


def _cases_and_gate(result, gate_report) -> list[tuple[str, str]]:
    """(kind, text) for each case that did not finish and each thing the gate found."""
    from kvbench.reportkit.tables import fmt_number

    lines = [(case.status, f"{case.id}: {case.error.type}: {case.error.message[:300]}")
             for case in result.cases if case.status != "ok" and case.error is not None]
    if gate_report is not None:
        lines += [("gate", reason) for reason in gate_report.reasons]
        if gate_report.expect_all:
            lines += [("gate", f"{case_id}: in the baseline, not in this run")
                      for case_id in gate_report.missing_cases]
        lines += [("regression", f"{row.case_id} {row.metric}: {fmt_number(row.baseline)} ->"
                                 f" {fmt_number(row.current)} ({row.rule})")
                  for row in gate_report.regressions]
    return lines


def summary(result, gate_report, out_dir: Path, baseline_path: str | None = None) -> None:
    from kvbench.run.files import JSON, REPORT

    claims = [cl for c in result.cases for cl in c.claims]
    held = sum(cl.verdict == "held" for cl in claims)
    unmet = sum(cl.verdict == "unmet" for cl in claims)
    skipped = sum(cl.verdict == "skipped" for cl in claims)
    errors = [c for c in result.cases if c.status not in ("ok", "refused")]
    refused = Counter(REFUSED_BECAUSE.get(c.error.type, c.error.type)
                      for c in result.cases if c.status == "refused" and c.error)
    if claims:
        console.print(claims_table(result))
    judged = len(claims) - skipped  # a skipped claim was not judged: it holds nothing
    parts = [f"claims held {held}/{judged}", f"failed {judged - held - unmet}"]
    if unmet:
        parts.append(f"goals not met {unmet}")
    if skipped:
        parts.append(f"skipped {skipped} (calibrated on another model than the case runs)")
    if gate_report is not None:
        parts.append(f"regressions {len(gate_report.regressions)}")
        parts.append(f"improvements {len(gate_report.improvements)}")
        if gate_report.not_comparable_cases:
            parts.append(f"not comparable {len(gate_report.not_comparable_cases)}")
    parts.append(f"errors {len(errors)}")
    if refused:
        why = ", ".join(f"{count}: {reason}" for reason, count in sorted(refused.items()))
        parts.append(f"refused {sum(refused.values())} ({why})")
    console.print("[bold]summary:[/] " + ", ".join(parts))
    for kind, text in _cases_and_gate(result, gate_report):
        mark = "[yellow]gate:[/]" if kind == "gate" else f"[red]{kind}[/]"
        console.print(f"  {mark} {escape(text)}")
    refresh = refresh_command(gate_report, out_dir / JSON, baseline_path)
    if refresh:
        console.print("  to gate them from now on, make this run their baseline:\n    "
                      + escape(refresh), soft_wrap=True)
    for case in result.cases:
        for warning in case.warnings:
            console.print(f"  [yellow]warning[/] {escape(case.id)}: {escape(warning)}")
    console.print(f"reports: {out_dir / REPORT}, {out_dir / JSON}")
