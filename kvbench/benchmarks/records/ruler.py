"""The ruler benchmark's record: written by kvbench.benchmarks.measure.ruler (its answers'
part by kvbench.benchmarks.measure.retrieval.common_info), read by
kvbench.benchmarks.reports.ruler and, for the per-sample scores and prompt hashes,
kvbench.judge.paired."""
from __future__ import annotations

from kvbench.benchmarks.records.common import AnsweringRecord


class RulerRecord(AnsweringRecord):
    """One ruler case: one task at one length, per sample in the order answered."""

    scores: list[float] | None = None  # per sample, 0-100 (RULER's scoring)
    metric: str | None = None  # string_match_all or string_match_part
    haystack: str | None = None  # what the haystack text is (RULER's, or the essay in place)
    tokens_to_generate: int | None = None  # the task's answer budget
    prompt_tokens: float | None = None  # mean tokens of a prompt as fed
    prompt_sha256s: list[str] | None = None  # per sample: its prompt's tokens' hash
    predictions: list[str] | None = None  # per sample: the answer's text
    stopped: str | None = None  # why the case answered as many samples as it did
