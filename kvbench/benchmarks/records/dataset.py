"""The dataset benchmark's record: written by kvbench.benchmarks.measure.dataset (its answers'
part by kvbench.benchmarks.measure.retrieval.common_info), read by
kvbench.benchmarks.reports.dataset and, for the per-sample scores and prompt hashes,
kvbench.judge.paired."""
from __future__ import annotations

from kvbench.benchmarks.records.common import AnsweringRecord


class DatasetRecord(AnsweringRecord):
    """One dataset case, per scored sample in the order of `rows`."""

    scores: list[float] | None = None  # per scored sample, 0-100 (LongBench's scorer)
    rows: list[int] | None = None  # per scored sample: its row in the data, from 0
    prompt_sha256s: list[str] | None = None  # per scored sample: its prompt's tokens' hash
    predictions: list[str] | None = None  # per scored sample: the answer's text
    metric: str | None = None  # the LongBench metric scored
    skipped_rows: list[int] | None = None  # rows longer than max_length, left out
    truncated_rows: list[int] | None = None  # rows cut to max_length in the middle
    prompt_tokens: float | None = None  # mean tokens of a scored prompt as fed
