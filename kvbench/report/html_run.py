"""One result file on the results page (kvbench.report.html): what the page's sections, its
headline figures (html_figures) and its paired comparisons (html.py) are drawn from."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.results import RunResult


@dataclass
class Run:
    """One result file on the page: its number, where it came from, its folder (its
    results.json, report.md and figures) as a path relative to the page, and its figures."""

    index: int
    source: str
    result: RunResult
    folder: str
    figures: list[str]

    @property
    def label(self) -> str:
        return f"#{self.index} {self.result.suite.name} · {self.result.machine.get('key', '?')}"
