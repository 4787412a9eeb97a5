"""The compaction benchmark's record: what kvbench.benchmarks.measure.compaction writes into a
case's info (its report, kvbench.benchmarks.reports.compaction, reads none of it)."""
from __future__ import annotations

from kvbench.benchmarks.records.base import Record


class CompactionRecord(Record):
    """The compacted cache's answer beside the plain cache's, and what each layer kept."""

    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    answer: str | None = None  # the greedy answer from the compacted cache, decoded
    plain_answer: str | None = None  # the plain cache's, from the whole trajectory
    kept_tokens_per_layer: list[int] | None = None  # K/V slots kept, block summaries included
