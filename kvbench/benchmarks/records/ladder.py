"""The ladder benchmark's record: what kvbench.benchmarks.measure.ladder writes into a case's
info, which its report (kvbench.benchmarks.reports.ladder) reads back."""
from __future__ import annotations

from kvbench.benchmarks.records.base import Record


class LadderRecord(Record):
    """One rung: what its peak measured, the plain cache's bytes, and the text it read."""

    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    peak_memory: str | None = None  # what peak_bytes measured (Session.peak_memory)
    plain_kv_bytes: int | None = None  # the plain cache's bytes for the tokens seen
    end_prefill_s: float | None = None  # of prefill_s, the end_prefill (compaction) part
    generated: list[int] | None = None  # the greedy decode's tokens
    text: str | None = None  # the text param the prompt came from
    text_repeats: int | None = None  # times the text was read to fill offset + length
    beyond_trained_context: bool | None = None  # length + decode past the model's context
    torch_threads: int | None = None
