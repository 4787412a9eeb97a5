"""The proofs benchmark's record: what kvbench.benchmarks.measure.proofs writes into a case's
info, which its report (kvbench.benchmarks.reports.proofs) reads back."""
from __future__ import annotations

from kvbench.benchmarks.records.base import Record


class ProofsRecord(Record):
    """The vectors the codecs were measured on, and what of the method they leave out."""

    shape: list[int] | None = None  # (1, kv heads, tokens, head_dim) of the keys (and values)
    data_sha256: str | None = None  # of the keys' and values' bytes in dtype
    layout: str | None = None  # Implementation.layout(): what the method's ratios are made of
    # what the method's cache does beyond its codecs (policy_beyond_codec()), when anything
    policy_not_measured: list[str] | None = None
