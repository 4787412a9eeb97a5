"""Parts that several benchmarks' records share: a paired verdict against a reference on the
same samples, what the answering benchmarks write of each answer (kvbench.benchmarks.measure
.retrieval.common_info), and what a case says of the server that measured it
(kvbench.benchmarks.measure.servers.pooled_server)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kvbench.benchmarks.records.base import Record


class PairedVerdict(BaseModel):
    """A paired comparison (kvbench.judge.paired): the exact sign test's verdict and p over
    the pairs that differ, the mean difference and its paired bootstrap interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    wins: int
    losses: int
    p_value: float | None = None
    mean_difference: float | None = None
    low: float | None = None
    high: float | None = None
    verdict: str | None = None


class AnsweringRecord(Record):
    """Per answer, in the order of the case's samples (what output-length drift is paired
    on), and how the method's cache was read while answering."""

    generated: list[int] | None = None
    answer_s: list[float] | None = None
    codec_reads: str | None = None
    layout: str | None = None
    # tokens per prefill forward; 0: each prompt in one forward (the method reads it at once)
    prefill_chunk: int | None = None


class ServedRecord(Record):
    """The server a case was measured through."""

    server: str | None = None
    server_log: str | None = None
    server_log_note: str | None = None
    server_started_for_this_case: bool | None = None
    server_ready_s: float | None = None
    server_command: list[str] | None = None
    server_uses_method: bool | None = None
