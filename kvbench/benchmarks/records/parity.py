"""The parity benchmark's record: what kvbench.benchmarks.measure.parity writes into a case's
info (on torch and MLX alike); no report reads it."""
from __future__ import annotations

from kvbench.benchmarks.records.base import Record


class ParityRecord(Record):
    """Per decoded step, the cached decode's token and its KL from the full recompute."""

    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    kl_per_step: list[float] | None = None  # KL(full || cached), nats, rounded to 6 places
    tokens: list[int] | None = None  # the tokens decoded greedily through the cache
