"""The multiturn benchmark's record: written by kvbench.benchmarks.measure.multiturn, read by
kvbench.benchmarks.reports.multiturn and, for the per-answer scores and prompt hashes,
kvbench.judge.paired. Per-(sample, turn) lists are sample-major: entry sample * turns + turn."""
from __future__ import annotations

from kvbench.benchmarks.records.common import AnsweringRecord


class MultiturnRecord(AnsweringRecord):
    """One multiturn case; generated and answer_s are per (sample, turn), sample-major."""

    order: str | None = None  # how the per-(sample, turn) lists are ordered, in words
    turns: int | None = None  # questions per sample
    scores: list[float] | None = None  # per (sample, turn), 0-100 (string_match_all)
    prompt_sha256s: list[str] | None = None  # per (sample, turn): context and question's hash
    turn_scores: list[float] | None = None  # per turn: the mean score over the samples
    turn_ci: list[tuple[float, float]] | None = None  # per turn: its 95% Wilson interval
    turn_retained_bytes: list[float] | None = None  # per turn: mean accounted bytes held after
    sample_scores: list[list[float]] | None = None  # [sample][turn] scores
    depths: list[list[float]] | None = None  # [sample][turn]: the asked needle's depth, percent
    prompt_tokens: float | None = None  # mean tokens of the context and first question
    between_turns: str | None = None  # the chat template's text from an answer to the next ask
    haystack: str | None = None  # what the haystack text is
