"""stress's record: what kvbench.benchmarks.measure.stress writes into a case's info (with
kvbench.benchmarks.measure.servers.pooled_server's keys of the server), read back by
kvbench.benchmarks.reports.stress and stress_prefix."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kvbench.benchmarks.records.common import PairedVerdict, ServedRecord


class RequestsSummary(BaseModel):
    """The level's requests over its repeats (the long-prompt user's included)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    planned: int
    sent: int
    ok: int
    failed: int


class ScorePairs(PairedVerdict):
    """With a task: each successful response under load against the single-user answer to its
    prompt, in score points (kvbench.benchmarks.measure.stress.score_figures)."""

    of: str | None = None  # what is paired, in words (always written; hand-made results omit it)
    pairs: list[tuple[int, float, float]]  # (prompt, score under load, score alone)
    p_value: float
    mean_difference: float
    low: float
    high: float
    verdict: str


class Slo(BaseModel):
    """With a task: the SLOs goodput counted against (None: no such SLO)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_s: float | None = None
    tpot_s: float | None = None


class PrefixCacheState(BaseModel):
    """A kvbench server's /health prefix_cache at the case's end (kvbench.serve.prefix_store);
    empty when the server did not say."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix_cache_entries: int | None = None  # prefixes kept
    prefix_cache_bytes: int | None = None  # their arrays' bytes
    prefix_cache_hits: int | None = None  # prompts started from a kept prefix
    prefix_cache_misses: int | None = None
    prefix_cache_reused_tokens: int | None = None


class StressRecord(ServedRecord):
    """One concurrency level's case through its server."""

    warmup_error: str | None = None  # the server's first request failed (not in any figure)
    requests_summary: RequestsSummary | None = None
    failures: dict[str, int] | None = None  # a failed request's first error line: how many
    level_timed_out: bool | None = None  # level_timeout_s cut some repeat's level
    token_count_source: dict[str, int] | None = None  # where output tokens were counted from
    token_ids_source: dict[str, int] | None = None  # where the responses' token ids came from
    logprobs: bool | None = None  # every single-user answer came with top logprobs
    repeats: int | None = None
    paired: ScorePairs | None = None  # with a task and a successful response
    # per prompt, in prompt order, from the single-user pass
    prompt_sha256s: list[str] | None = None
    generated: list[int] | None = None  # its answer's tokens, end-of-sequence not counted
    answer_s: list[float] | None = None  # request sent to response finished
    scores_alone: list[float] | None = None  # with a task: its answer's score
    # with a task: the task's settings
    task: str | None = None
    metric: str | None = None  # the task's scoring metric (string_match_all, ...)
    tokens_to_generate: int | None = None
    prompt_tokens: float | None = None  # the mean over the prompts
    slo: Slo | None = None
    prefix_cache: PrefixCacheState | None = None  # with prefix_cache and a kvbench server
    single_user_tok_s: float | None = None  # the single-user pass's output tok/s
    kv_budget: int | None = None
    percentiles: str | None = None  # how the percentiles were computed
