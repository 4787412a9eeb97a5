"""What a benchmark declares of its part of a run's report (its `report`, a BenchmarkReport):
the sections after its table in report.md (with their figures), its leaderboard's columns on
the results page, and the metrics that sum it up in the by-method table. The renderers
(kvbench.report.markdown, kvbench.report.html) ask each benchmark of a run for it; a benchmark
that declares nothing gets the generic report: its table, and a leaderboard of its first
metrics."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.results import RunResult


@dataclass(frozen=True)
class Board:
    """A leaderboard's columns: the compression axis, the quality axis, then other figures."""

    compression: str | None
    quality: str | None
    extra: tuple[str, ...] = ()


class BenchmarkReport:
    """A benchmark's part of the report. The generic one has no board (the page shows the
    benchmark's first metrics), no headline metrics and no sections; a benchmark's own report
    is a subclass (for sections) or an instance with a board and headline metrics."""

    board: Board | None = None  # its leaderboard's columns on the results page
    headline: tuple[str, ...] = ()  # its metrics in the by-method table of report.md

    def __init__(self, board: Board | None = None, headline: tuple[str, ...] | None = None):
        if board is not None:
            self.board = board
        if headline is not None:
            self.headline = tuple(headline)

    def sections(self, result: RunResult, out_dir: Path | None = None) -> list[str]:
        """The Markdown parts after the benchmark's table in the run's report.md; its figures
        are written into out_dir when it is given, and the text is the same either way (so
        `kvbench report` prints what the run wrote)."""
        return []
