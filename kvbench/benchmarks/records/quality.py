"""The quality benchmark's record: what kvbench.benchmarks.measure.quality writes into a case's
info (on torch and MLX alike; its report, kvbench.benchmarks.reports.quality, reads none of
it)."""
from __future__ import annotations

from kvbench.benchmarks.records.base import Record


class QualityRecord(Record):
    """How many positions were compared, and each cache's greedy text."""

    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    positions: int | None = None  # teacher-forced positions compared
    greedy_text: str | None = None  # the method's cache's greedy tokens, decoded
    greedy_text_plain: str | None = None  # the plain cache's
