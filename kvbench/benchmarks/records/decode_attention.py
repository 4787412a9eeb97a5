"""The decode_attention benchmark's record: what kvbench.benchmarks.measure.decode_attention
writes into a case's info (its report, kvbench.benchmarks.reports.decode_attention, reads none
of it)."""
from __future__ import annotations

from typing import Literal

from kvbench.benchmarks.records.base import Record


class DecodeAttentionRecord(Record):
    """How the fused read, SDPA, decode-then-SDPA and the copy were timed, over what K/V."""

    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    copies: int | None = None  # K/V sets cycled through
    # calls per timed sample of each path: fused, sdpa, decode_sdpa, memcpy
    calls_per_sample: dict[str, int] | None = None
    timing: Literal["CUDA graph replays", "eager calls"] | None = None
    device_name: str | None = None  # the CUDA device's name, else the device type ("cpu")
    shape: list[int] | None = None  # (batch, kv_heads, context, head_dim) of the K/V
    q_heads: int | None = None
    tile: str | None = None  # the triton kernel's autotuned tile (CUDA only, when it ran)
