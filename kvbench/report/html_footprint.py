"""The results page's memory footprint section: report.md's table (kvbench.reportkit.footprint)
for every run shown, each case linked to its details, sortable."""
from __future__ import annotations

from kvbench.report.html_parts import esc, row, section, table
from kvbench.report.html_run import Run
from kvbench.reportkit.footprint import (
    COLUMNS, LEGEND, footprint_cases, footprint_cells, probe_lines,
)


def footprint_section(runs: list[Run], anchors: dict) -> str:
    """"" where no run recorded a footprint (runs made before kvbench recorded them)."""
    rows, notes = [], []
    many = len(runs) > 1
    for run in runs:
        shown = footprint_cases(run.result.cases)
        for case in shown:
            link = f"<a href='#{anchors[(run.index, case.id)]}'>{esc(case.id)}</a>"
            cells = [f"<td class='num' data-v='{'' if c.value is None else repr(c.value)}'>"
                     f"{esc(c.text)}</td>" for c in footprint_cells(case)]
            rows.append(row(([esc(f"#{run.index}")] if many else []) + [link] + cells))
        if shown:
            notes += [f"{run.label}: {line}" if many else line for line in probe_lines(shown)]
    if not rows:
        return ""
    head = (["run"] if many else []) + ["case"] + [column for _, column in COLUMNS]
    note = "<p class='note'>" + esc(" · ".join([LEGEND, *notes])) + "</p>"
    return section("Memory footprint", note + table(head, rows, sortable=True,
                                                     table_id="footprint"))
