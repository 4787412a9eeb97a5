"""What a benchmark declares of its part of a run's report (its `report`, a BenchmarkReport):
the sections after its table in report.md (with their figures), its leaderboard's columns on
the results page, the metrics that sum it up in the by-method table, and its row: the cell of
each metric, which its table in report.md, in `kvbench report --readme` and on the results page
all show. The renderers (kvbench.report.markdown, readme, html) ask each benchmark of a run for
it; a benchmark that declares nothing gets the generic report: its table, and a leaderboard of
its first metrics."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kvbench.reportkit.tables import Cell, metric_cell
from kvbench.results import CaseResult, RunResult

# A report's sections for a run and an output folder, None for one with nothing to say.
Parts = Callable[[RunResult, Path | None], Iterable[str | None]]


@dataclass(frozen=True)
class Board:
    """A leaderboard's columns: the compression axis, the quality axis, then other figures."""

    compression: str | None
    quality: str | None
    extra: tuple[str, ...] = ()


class BenchmarkReport:
    """A benchmark's part of the report. The generic one has no board (the page shows the
    benchmark's first metrics), no headline metrics and no sections; a benchmark's own report
    is an instance with a board, headline metrics and `parts` (its sections, those that say
    nothing dropped), or a subclass (for its row's cells)."""

    board: Board | None = None  # its leaderboard's columns on the results page
    headline: tuple[str, ...] = ()  # its metrics in the by-method table of report.md
    parts: Parts | None = None  # its sections

    def __init__(self, board: Board | None = None, headline: tuple[str, ...] | None = None,
                 parts: Parts | None = None):
        if board is not None:
            self.board = board
        if headline is not None:
            self.headline = tuple(headline)
        if parts is not None:
            self.parts = parts

    def sections(self, result: RunResult, out_dir: Path | None = None) -> list[str]:
        """The Markdown parts after the benchmark's table in the run's report.md; its figures
        are written into out_dir when it is given, and the text is the same either way (so
        `kvbench report` prints what the run wrote)."""
        if self.parts is None:
            return []
        return [part for part in self.parts(result, out_dir) if part]

    def row(self, case: CaseResult, metrics: list[str]) -> list[Cell]:
        """The case's cells for `metrics`, in that order: the one row definition of every table
        of a benchmark (report.md, --readme, the results page's leaderboard)."""
        return [self.cell(case, name) for name in metrics]

    def cell(self, case: CaseResult, metric: str) -> Cell:
        """The value (a timed metric as median ± IQR/2 of its samples); empty where the case
        has no such metric."""
        found = case.metrics.get(metric)
        return Cell("") if found is None else Cell(metric_cell(found), found.value)
