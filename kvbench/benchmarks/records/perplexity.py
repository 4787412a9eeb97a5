"""perplexity's record: what kvbench.benchmarks.measure.perplexity writes into a case's info,
in process or through a server (then with kvbench.benchmarks.measure.servers.pooled_server's
keys of it), read back by kvbench.benchmarks.reports.perplexity."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kvbench.benchmarks.records.common import PairedVerdict, ServedRecord


class Window(BaseModel):
    """One window scored: where it starts in the tokenised text, and the NLL sums (nats) of its
    continuation through the method's cache (or the server) and through the plain cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    offset: int
    nll: float
    nll_plain: float


class VsPlain(PairedVerdict):
    """With windows >= 2: each window's NLL per scored token against the plain cache's
    (kvbench.judge.paired.compare_paired, lower is better)."""

    unit: str
    pairs: int  # windows compared
    p_value: float
    mean_difference: float
    low: float
    high: float
    verdict: str


class PerplexityRecord(ServedRecord):
    """One case's windows, scored in process or through a server. In process, the keys it does
    not name are the method's cache counters (Implementation.counters(), the mean over windows:
    sparse-V's rows skipped, the decay cache's evictions, adaptive's heads per width, a plug-in's
    own): any name, a number."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, float]

    layout: str | None = None  # what the method's ratios are made of (in process, kvbench serve)
    tokens: int | None = None  # context + continuation, per window
    text: str | None = None
    windows: list[Window] | None = None
    perplexity_interval: tuple[float, float] | None = None  # 95% over the windows (>= 2)
    vs_plain: VsPlain | None = None
    # in process
    peak_memory_bytes: int | None = None
    prefill_chunk: int | None = None  # tokens per prefill forward (0: the context in one)
    peak_memory: str | None = None  # what peak_memory_bytes measured
    # through a server
    scored_by: str | None = None  # how the server scored the windows, in words
    request_s: list[float] | None = None  # each window's request, every repeat
