"""The speed benchmark's record: what kvbench.benchmarks.measure.speed writes into a case's
info (on torch and MLX alike). Its report (kvbench.benchmarks.reports.speed) reads none of it;
kvbench.reportkit.tables reads not_timed to show n/a."""
from __future__ import annotations

from typing import Literal

from kvbench.benchmarks.records.base import Record


class SpeedRecord(Record):
    """What was encoded, on which arrays, and the steps that did no work."""

    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    n: int | None = None  # vectors encoded
    dim: int | None = None
    dtype: Literal["float16", "bfloat16", "float32"] | None = None  # of the input
    decoded_shape: list[int] | None = None  # the decoded chunks' shape joined along tokens
    backend: Literal["torch", "mlx"] | None = None  # the arrays' backend
    # steps ("encode", "decode") that handed back their input: no metric, the report's n/a
    not_timed: list[Literal["encode", "decode"]] | None = None
    torch_threads: int | None = None
