"""`stress`'s declaration: N concurrent users against an OpenAI-compatible server on loopback, one
concurrency level per case (a matrix over `users` makes the ladder of levels); the protocol is
kvbench.benchmarks.measure.stress's. Only loopback urls are accepted. The prompts are windows of
free text, or RULER task samples (`task`), scored under load and alone; with task samples, goodput
counts the requests that met the SLOs and were answered correctly."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvbench.benchmarks.records.stress import StressRecord
from kvbench.benchmarks.reports.stress import REPORT
from kvbench.benchmarks.specs.base import Benchmark, MetricSpec, register_benchmark
from kvbench.benchmarks.specs.retrieval import RETRIEVAL_METRICS
from kvbench.benchmarks.specs.server_target import (
    ServerTarget, missing_server_library, parse_server,
)
from kvbench.config.fields import (
    LibraryMissing, Settings, SettingError, above, at_least, one_of, param,
)
from kvbench.data.ruler import TASKS, TaskSpec
from kvbench.data.text import parse_hf_source, resolve_text
from kvbench.models.info import ModelInfo

PERCENTILES = (50, 90, 99)
PERCENTILE_METHOD = "linear"  # numpy.percentile's: linear interpolation between order statistics
NO_TASK = "none"
CORRECT = 100.0  # a response is answered correctly when its score is this (every reference found)
# SLOs sized for the bundled SmolLM2-135M on a shared 2-core CPU (see slo_ttft_s, slo_tpot_s)
SLO_TTFT_S = 10.0
SLO_TPOT_S = 0.5


@dataclass
class StressParams(Settings):
    """Parameters of the stress benchmark (one concurrency level; a matrix over `users` makes
    the ladder)."""

    users: int = param(1, range=at_least(1), meaning="concurrent users, started together")
    requests_per_user: int = param(2, range=at_least(1), meaning="requests each user sends, one"
                                   " after another")
    prompts: int = param(8, range=at_least(1), meaning="distinct prompts: windows of"
                         " `prompt_tokens` tokens of the text at offsets drawn with the case's"
                         " seed, or with `task` that task's samples 0 .. prompts - 1. User u's"
                         " j-th request asks prompt (u * requests_per_user + j) % prompts")
    prompt_tokens: int = param(64, range=at_least(1), meaning="tokens per prompt (the model's"
                               " tokenizer); free text only")
    max_tokens: int = param(32, range=at_least(1), meaning="output tokens asked of every request"
                            " (greedy: temperature 0); free text only: a task sample asks its"
                            " task's tokens_to_generate")
    text: str = param("pydoc", meaning='"pydoc", a text file, or'
                      ' "hf:<dataset>[:<config>]:<split>:<column>"; the free-text prompts and'
                      " the long-prompt user's are windows of it")
    offset: int = param(0, range=at_least(0), meaning="the windows start at or after this token")
    task: str = param(NO_TASK, range=one_of(NO_TASK, *TASKS), meaning='"none": the prompts are'
                      " windows of free text, their answers only compared with the single-user"
                      " answers. A RULER task that needs no QA file ("
                      + ", ".join(t for t, spec in TASKS.items() if spec.needs_qa is None)
                      + "): the prompts are its samples, made by the ruler benchmark's"
                      " generators and framed by the model's chat template (context, question,"
                      " answer prefix); each asks the task's tokens_to_generate and ends at"
                      " end-of-sequence (never ignore_eos), and every response, under load and"
                      " alone, is scored as RULER scores it")
    task_length: int = param(1024, range=at_least(256), meaning="with a task: model tokens of"
                             " each sample's whole prompt, the task's tokens_to_generate included"
                             " (as ruler's length)")
    data_seed: int = param(0, meaning="with a task: samples are drawn from (data_seed, task,"
                           " sample index), as the ruler benchmark's: every method, and a ruler"
                           " case with the same seed, length and model, gets the same prompts")
    essay: str = param("pydoc", meaning="with a task whose haystack is an essay: the text in"
                       ' place of RULER\'s Paul Graham essays ("pydoc", a text file, or'
                       ' "hf:<dataset>[:<config>]:<split>:<column>")')
    api: Literal["completions", "chat"] = param(
        "completions", meaning="/v1/completions (a kvbench server gets the prompt's token ids,"
        " others its text) or /v1/chat/completions (one user message)")
    server: str | dict[str, Any] = param(
        "kvbench", rule="kvbench, or a mapping", meaning='"kvbench": kvbench starts `kvbench'
        ' serve` with the case\'s model and method on a free loopback port (one server per'
        " method setting, kept for the method's next case, its log beside the results)."
        ' {command: [...], url: ...}: kvbench starts `command` the same way ("{port}" in command'
        ' and url is filled with a free port, "{python}" with kvbench\'s interpreter,'
        ' "{gguf:NAME}" with bundled model NAME\'s GGUF). {url: ...}: a server someone else'
        " runs. Optional"
        " keys: model (the `model` sent in requests; default: left out, except the suite's"
        " model for kvbench), logprobs (true: ask for top-2 logprobs, which tell float noise"
        " from real differences; kvbench servers always get them), ready_timeout_s (300),"
        " api_key_env (the environment variable whose value is sent as the server's API key,"
        " 'Authorization: Bearer KEY'; default KVBENCH_API_KEY, sent where it is set, which a"
        " `kvbench serve` kvbench starts also asks for; never the key itself: a suite is"
        " recorded in its results). Hosts other than 127.0.0.1, localhost and ::1 are refused")
    kv_budget: int = param(0, range=at_least(0), meaning="bytes of KV cache `kvbench serve` may"
                           " hold over all sessions (--kv-budget); 0 = none. sessions_held is"
                           " how many it held at once")
    request_timeout_s: float = param(120.0, range=above(0), meaning="a request not finished by"
                                     " then fails")
    level_timeout_s: float = param(900.0, range=above(0), meaning="the whole level is cut here:"
                                   " requests still running or not sent fail")
    slo_ttft_s: float | None = param(SLO_TTFT_S, range=at_least(0), meaning="seconds: a"
                                     " request meets the time-to-first-token SLO when its TTFT"
                                     " is at most this (None or 0: no such SLO). The defaults"
                                     " are about 5x what one 1K-token request takes alone on"
                                     " the bundled model on a 2-core CPU (TTFT ~1.4-2.2 s, TPOT"
                                     " ~0.1 s); set your service's own")
    slo_tpot_s: float | None = param(SLO_TPOT_S, range=at_least(0), meaning="seconds: a"
                                     " request meets the time-per-output-token SLO when its"
                                     " TPOT ((e2e - ttft) / (output tokens - 1)) is at most"
                                     " this; a response of one token has none to miss (None or"
                                     " 0: no such SLO)")
    tie_margin: float = param(0.05, range=at_least(0), meaning="nats: a response that first"
                              " differs from the single-user answer where that answer's top-1"
                              " led its top-2 by at most this is float noise, not flagged")
    shift_nats: float = param(2.0, range=at_least(0), meaning="nats: so is one whose candidates"
                              " there are the answer's, perturbed: each side's token listed by"
                              " the other (top 5) and no shared candidate's logprob moved by more"
                              " than this (see responses_flagged). Sound 3- and 4-bit caches"
                              " move by up to ~2: fed the same tokens, batched and single-user"
                              " decode through intq4 on the bundled model differed by up to 1.9"
                              " in a logit within 30 steps (rounding flips accumulate)")
    ignore_eos: bool = param(True, meaning="ask kvbench servers (ignore_eos, a vLLM-style"
                             " extension) for exactly max_tokens tokens; other servers are not"
                             " sent it, nor are task samples, whose answers end at"
                             " end-of-sequence")
    long_prompt_tokens: int = param(0, range=at_least(0), meaning="0, or a long-prompt user:"
                                    " one more request at the level, a window of this many"
                                    " tokens of the text, sent long_prompt_after_s after the"
                                    " others start (mid-stream). Its prefill shows in the other"
                                    " users' chunk gaps; it is not in the latencies, throughput"
                                    " or answer checks (long_prompt_ttft_s is its own), and its"
                                    " failure counts in errors")
    long_prompt_after_s: float = param(1.0, range=at_least(0), meaning="seconds after the level"
                                       " starts that the long-prompt user sends its request")
    prefill_chunk: int = param(0, range=at_least(0), meaning="`kvbench serve --prefill-chunk`:"
                               " prompt tokens per prefill forward, the others' decode steps"
                               " between (0: its default, from the model and device: 512 on a"
                               " CPU, up to 2048 on a GPU). A chunk as long as the prompt"
                               " prefills it in one forward, as before chunked prefill")
    prefix_cache: int = param(0, range=at_least(0), meaning="`kvbench serve --prefix-cache`:"
                              " prompt prefixes (whole prefill chunks) the server keeps to start"
                              " later prompts that begin with them, bit for bit as a full"
                              " prefill (0: off)")
    shared_prefix_tokens: int = param(0, range=at_least(0), meaning="0, or free-text prompts"
                                      " that all begin with the same window of this many tokens"
                                      " of the text (a shared system prompt), drawn with the"
                                      " case's seed, before each prompt's own prompt_tokens."
                                      " The warm-up request sends it after its own tokens (the"
                                      " same shapes, no prefix in common), so the single-user"
                                      " pass's first request is the first with it the server"
                                      " sees (prefix_cold_ttft_s) and its later ones may reuse"
                                      " it (prefix_warm_ttft_s)")

    def check(self) -> None:
        for name in ("text", "essay"):
            if getattr(self, name).startswith("hf:"):
                try:
                    parse_hf_source(getattr(self, name))
                except ValueError as exc:
                    raise SettingError(name, str(exc)) from None
        spec = self.task_spec
        if spec is not None and spec.needs_qa:
            offline = ", ".join(t for t, s in TASKS.items() if s.needs_qa is None)
            raise SettingError("task", f"task {self.task} reads {spec.needs_qa}, a QA file"
                               " kvbench does not ship (the ruler benchmark takes it as"
                               f" qa_data); stress's task samples are the offline ones: {offline}")
        try:
            target = parse_server(self.server)  # loopback unless it says remote
        except ValueError as exc:
            raise SettingError("server", str(exc)) from None
        if self.shared_prefix_tokens and self.task_spec is not None:
            raise SettingError("shared_prefix_tokens", "shared_prefix_tokens: the shared prefix"
                               " is free text; a task's samples are framed by the chat template"
                               " (leave task none)")
        if self.shared_prefix_tokens and self.prompts < 2:
            raise SettingError("prompts", "prompts: a shared prefix needs at least 2 prompts,"
                               " one to see it first and one to reuse it")
        for name in ("kv_budget", "prefill_chunk", "prefix_cache"):
            if getattr(self, name) and target.kind != "kvbench":
                raise SettingError(name, f"{name} is passed to kvbench serve: it needs"
                                         " server: kvbench")
        missing = missing_server_library(target)
        if missing:  # its cases are refused, the suite's others run
            raise LibraryMissing("server", missing)

    @property
    def target(self) -> ServerTarget:
        return parse_server(self.server)

    @property
    def task_spec(self) -> TaskSpec | None:
        """The RULER task's spec (kvbench.data.ruler.TaskSpec); None for free text."""
        return None if self.task == NO_TASK else TASKS[self.task]


def percentile_metrics(name: str, what: str) -> dict[str, MetricSpec]:
    """p50/p90/p99 of one latency, in seconds."""
    return {f"{name}_p{q}": MetricSpec(
        "s", "lower", f"{what}; the {q}th percentile over the level's successful requests"
        f" (numpy, method '{PERCENTILE_METHOD}'); NaN without any", timing="absolute")
        for q in PERCENTILES}


METRICS = {
    "output_tok_s": MetricSpec(
        "tok/s", "higher", "aggregate output throughput: every successful request's output"
        " tokens (the server's usage, else its token ids, else the model's tokenizer) / wall_s",
        timing="absolute"),
    "per_user_tok_s": MetricSpec(
        "tok/s", "higher", "the mean over users of a user's output tokens / that user's busy"
        " time (its first request sent to its last response finished)", timing="absolute"),
    "request_throughput": MetricSpec(
        "req/s", "higher", "successful requests / wall_s", timing="absolute"),
    **percentile_metrics("ttft_s", "time to first token: request sent to the first stream chunk"
                         " that carries a token"),
    **percentile_metrics("tpot_s", "time per output token after the first: (e2e - ttft) /"
                         " (output tokens - 1), per request with at least 2 tokens"),
    **percentile_metrics("chunk_gap_s", "the gap between consecutive token-carrying stream chunks,"
                         " pooled over requests (a chunk may carry more than one token on some"
                         " servers)"),
    "chunk_gap_s_max": MetricSpec(
        "s", "lower", "the largest gap between consecutive token-carrying stream chunks of a"
        " successful request: a stall of every stream at once (a long prompt prefilled in one"
        " forward) is a few gaps among hundreds, below the p99", timing="absolute"),
    **percentile_metrics("e2e_s", "end-to-end latency: request sent to its response finished"),
    "long_prompt_ttft_s": MetricSpec(
        "s", "lower", "the long-prompt user's time to first token (long_prompt_tokens); absent"
        " without one, NaN when it failed; the median over repeats", timing="absolute"),
    "wall_s": MetricSpec("s", "lower", "the level's wall time: its first request sent to its"
                         " last response finished (failed ones included)", timing="absolute"),
    "requests": MetricSpec("", "none", "requests planned at the level (users x"
                           " requests_per_user, times the repeats)"),
    "errors": MetricSpec(
        "", "lower", "failed requests: a non-200 status, an exception, a timeout, a stream with"
        " no token, or not sent before level_timeout_s (info.failures says why); the"
        " long-prompt user's request included"),
    "output_tokens": MetricSpec("tok", "none", "output tokens of the successful requests"),
    "token_agreement": MetricSpec(
        "", "higher", "the mean over successful responses of (their common prefix with the"
        " single-user answer to the same prompt, in tokens) / (the single-user answer's"
        " tokens); 1 = every response equals its single-user answer"),
    "responses_differing": MetricSpec(
        "", "lower", "successful responses not identical (token ids) to the single-user answer"),
    "responses_flagged": MetricSpec(
        "", "lower", "differing responses whose first difference is beyond float noise: not a"
        " near-tie (the single-user answer's top-1 led its top-2 by more than tie_margin nats"
        " there) and not the same candidates perturbed (a side's token missing from the other's"
        " top 5, or a shared candidate's logprob moved by more than shift_nats), or not"
        " judgeable (no logprobs); a cache that leaks between sessions, reading another context,"
        " shows here. Quantized caches turn batching's float noise into whole rounding steps,"
        " which move logprobs by tenths of a nat: their perturbations exceed tie_margin"),
    "sessions_held": MetricSpec(
        "", "higher", "capacity, measured client side: the most successful requests that had"
        " received their first token and not yet finished at the same moment (the median over"
        " repeats)"),
    "aggregate_vs_single": MetricSpec(
        "x", "higher", "output_tok_s / the output tok/s of the single-user reference pass (one"
        " request at a time) on the same server in the same run", timing="ratio"),
    "per_user_vs_single": MetricSpec(
        "x", "higher", "per_user_tok_s / the output tok/s of the single-user reference pass on"
        " the same server in the same run", timing="ratio"),
    # task samples (`task`); free-text cases do not record them (TASK_METRICS)
    "score": MetricSpec(
        "%", "higher", "with a task: the mean of NVIDIA RULER's per-sample score (0-100) over the"
        " level's successful responses, under load (NaN without any)"),
    "score_ci_low": RETRIEVAL_METRICS["score_ci_low"],
    "score_ci_high": RETRIEVAL_METRICS["score_ci_high"],
    "score_alone": MetricSpec(
        "%", "higher", "with a task: the score of the single-user answers (one request at a"
        " time, same server) to the prompts of the level's successful responses, one per"
        " response: score's paired counterpart"),
    "score_vs_alone": MetricSpec(
        "%", "higher", "with a task: the mean over the level's successful responses of (its score"
        " - the single-user answer's to its prompt), points; 0 when load changes no answer's"
        " score (info.paired: the sign test's verdict and the paired interval)"),
    "goodput_rps": MetricSpec(
        "req/s", "higher", "with a task: requests that met both SLOs (slo_ttft_s, slo_tpot_s) and"
        " were answered correctly (score 100 under the task's metric: every reference found for"
        " string_match_all, one for string_match_part) / wall_s", timing="absolute"),
    "slo_attainment": MetricSpec(
        "", "higher", "the share of the level's planned requests that succeeded and met both"
        " SLOs (a failed request meets neither)", timing="absolute"),
    "correct_share": MetricSpec(
        "", "higher", "with a task: the share of the level's planned requests answered correctly"
        " (score 100, as goodput_rps; a failed request is not)"),
    # a shared prefix (`shared_prefix_tokens`); cases without one do not record them
    "prefix_cold_ttft_s": MetricSpec(
        "s", "lower", "with shared_prefix_tokens: the TTFT of the single-user pass's first"
        " request, the first the server sees the shared prefix in", timing="absolute"),
    "prefix_warm_ttft_s": MetricSpec(
        "s", "lower", "with shared_prefix_tokens: the median TTFT of the single-user pass's"
        " later requests, each with the same prefix as the first (reused with prefix_cache)",
        timing="absolute"),
    "prefix_warm_vs_cold": MetricSpec(
        "x", "lower", "prefix_warm_ttft_s / prefix_cold_ttft_s: what the prefix cache saves of"
        " a request's time to first token (about 1 without it)", timing="ratio"),
    "answer_tokens": MetricSpec(
        "tok", "none", "the mean over the level's successful responses of the tokens generated,"
        " end-of-sequence not counted"),
    "answer_tokens_alone": MetricSpec(
        "tok", "none", "the mean over the level's successful responses of the tokens the"
        " single-user answer to the same prompt generated (end-of-sequence not counted): a"
        " difference from answer_tokens is output length drifting under load"),
}
# What only task samples measure: a free-text case records none of them.
TASK_METRICS = ("score", "score_ci_low", "score_ci_high", "score_alone", "score_vs_alone",
                "goodput_rps", "correct_share")
PREFIX_METRICS = ("prefix_cold_ttft_s", "prefix_warm_ttft_s", "prefix_warm_vs_cold")
# Figures of one level pass that are medians over repeats (the rest are totals, see METRICS).
# (The prefix figures are the single-user pass's, measured once.)
PER_PASS = [name for name, spec in METRICS.items()
            if spec.timing is not None and name not in PREFIX_METRICS]


@register_benchmark("stress")
class Stress(Benchmark):
    """Concurrent users against an OpenAI-compatible server on loopback (kvbench serve with the
    case's method, or another server): throughput, TTFT/TPOT/chunk-gap/e2e percentiles, errors,
    answers against the single-user answers, sessions held. One level (users) per case."""
    measured_in = "kvbench.benchmarks.measure.stress"
    report = REPORT
    record = StressRecord

    Params = StressParams
    metrics = METRICS
    uses_model = True
    extras = ("serve",)  # kvbench serve, and httpx as the users' client

    def resolve_paths(self, params: StressParams, base_dir: Path) -> StressParams:
        return dataclasses.replace(params, text=resolve_text(params.text, base_dir),
                                   essay=resolve_text(params.essay, base_dir))

    def workload(self, params: StressParams) -> float:
        prompt = params.prompt_tokens if params.task_spec is None else params.task_length
        return float(params.users * params.requests_per_user * (prompt + params.max_tokens))

    def check(self, params: StressParams, model: ModelInfo | None) -> None:
        self.check_text_and_model(params.text, model)
        spec = params.task_spec
        if spec is None:
            self.check_length(model, "shared_prefix_tokens + prompt_tokens + max_tokens",
                              params.shared_prefix_tokens + params.prompt_tokens
                              + params.max_tokens, "shared_prefix_tokens", "prompt_tokens",
                              "max_tokens")
        else:
            if spec.needs_essay:
                self.check_text_and_model(params.essay, model, "essay")
            self.check_length(model, "task_length", params.task_length, "task_length")
        if params.long_prompt_tokens:
            self.check_length(model, "long_prompt_tokens + max_tokens",
                              params.long_prompt_tokens + params.max_tokens,
                              "long_prompt_tokens", "max_tokens")
