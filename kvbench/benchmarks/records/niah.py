"""The niah benchmark's record: written by kvbench.benchmarks.measure.niah (its answers' part
by kvbench.benchmarks.measure.retrieval.common_info), read by kvbench.benchmarks.reports.niah
and, for the per-sample scores and prompt hashes, kvbench.judge.paired."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kvbench.benchmarks.records.common import AnsweringRecord


class NiahGrid(BaseModel):
    """The heatmap: the mean score of each cell, scores[depth row][length column] (None: a cell
    without a score, which the report leaves blank)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lengths: list[int]  # context lengths, tokens, as asked
    depths: list[float]  # needle depths, percent, as asked
    scores: list[list[float | None]]


class NiahRecord(AnsweringRecord):
    """One niah case: a grid of lengths x depths, per sample in the order drawn (by length,
    then depth, then sample)."""

    grid: NiahGrid | None = None
    scores: list[float] | None = None  # per sample, 0-100 (RULER's scoring)
    prompt_sha256s: list[str] | None = None  # per sample: its prompt's tokens' hash
    predictions: list[str] | None = None  # per sample: the answer's text
    haystack: str | None = None  # what the haystack text is
