"""The memory footprint of a run's model-running cases, as kvbench.run.case records it (peak, what
was held when the probe was reset, the method's caches at their largest, what kvbench's own
evaluation added above them), in one table: report.md's section and the results page's share its
rows. A benchmark's tables leave these metrics out (tables.recorded_by_runner), but those the
benchmark reports itself (ladder's peak_bytes)."""
from __future__ import annotations

from pathlib import Path

from kvbench.reportkit.footprint_growth import growth_section
from kvbench.reportkit.tables import Cell, md_table, metric_cell
from kvbench.results import CaseResult

# (metric, column): the figures each row shows, in order
COLUMNS = (
    ("peak_bytes", "peak"),
    ("held_at_start_bytes", "held at start"),
    ("cache_high_water_bytes", "caches at their largest"),
    ("plain_cache_bytes", "plain cache"),
    ("eval_overhead_bytes", "eval overhead"),
    ("eval_overhead", "eval overhead ÷ plain cache"),
)
LEGEND = ("eval overhead = peak − held at start − caches at their largest (the most the method's"
          " live caches held at once, accounted bytes); held at start: the model loaded, its"
          " weights included; plain cache: the same caches' tokens at the model's dtype")


def footprint_cases(cases: list[CaseResult]) -> list[CaseResult]:
    """The cases that recorded a footprint (model-running cases that finished ok)."""
    return [case for case in cases if case.footprint is not None and case.status == "ok"]


def footprint_cells(case: CaseResult) -> list[Cell]:
    """The case's cells for COLUMNS (empty where it has no such metric)."""
    cells = []
    for name, _ in COLUMNS:
        metric = case.metrics.get(name)
        cells.append(Cell("") if metric is None else Cell(metric_cell(metric), metric.value))
    return cells


def probes(cases: list[CaseResult]) -> dict[str, list[str]]:
    """What each peak measured -> the ids of the cases it measured."""
    found: dict[str, list[str]] = {}
    for case in footprint_cases(cases):
        found.setdefault(case.footprint.probe, []).append(case.id)
    return found


def probe_lines(cases: list[CaseResult]) -> list[str]:
    """One line per probe: what the peak measured, and which cases where they differ."""
    found = probes(cases)
    if len(found) == 1:
        return [f"peak: {next(iter(found))}"]
    return [f"peak of {', '.join(ids)}: {probe}" for probe, ids in found.items()]


def footprint_section(cases: list[CaseResult], heading: str = "## Memory footprint",
                      out_dir: Path | None = None) -> str:
    """The table of the cases' footprints under `heading`, and how they grow with the context
    where a method ran at several (its figure written to out_dir when given); "" where none
    recorded one (a run made before kvbench recorded them, or without a model)."""
    shown = footprint_cases(cases)
    if not shown:
        return ""
    rows = [[case.id, *(cell.text for cell in footprint_cells(case))] for case in shown]
    table = md_table(["case", *(column for _, column in COLUMNS)], rows,
                     right=set(range(1, len(COLUMNS) + 1)))
    notes = " · ".join([LEGEND, *probe_lines(shown)])
    parts = [heading, table, f"<sub>{notes}</sub>", growth_section(shown, out_dir)]
    return "\n\n".join(part for part in parts if part)
