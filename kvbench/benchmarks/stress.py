"""`stress`: N concurrent users against an OpenAI-compatible server on loopback, one concurrency
level per case (a matrix over `users` makes the ladder of levels).

Protocol: `prompts` distinct prompts, each a window of `prompt_tokens` tokens of the text at a
seeded offset. The server (`server: kvbench` starts `kvbench serve` with the case's model and
method; see ServerTarget for the others) gets one warm-up request when it starts, then, once per
server and run, the single-user reference: every prompt answered one request at a time. Then the
level: `users` users start together, each sending `requests_per_user` streamed greedy requests
one after another (user u's j-th asks prompt (u * requests_per_user + j) % prompts, so every
answer has a single-user answer to be compared with). Every response at the level is compared
with the single-user answer to its prompt, token by token: a cache that leaks between sessions
changes confident tokens and is flagged; a near-tie that batching's float order flips is not.

The server is kept running for the next case of the same method (the run's memo holds it and
stops it when the run ends); a case that needs another server stops it first. kvbench never
sends anything to a host other than 127.0.0.1, localhost or ::1: other urls are refused when the
suite is validated.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from random import Random
from typing import Any, Literal

from kvbench.benchmarks.base import (
    Benchmark,
    BenchmarkOutput,
    MetricSpec,
    RunContext,
    check_at_least,
    register_benchmark,
)
from kvbench.benchmarks.load_generator import (
    PERCENTILE_METHOD,
    candidates_at,
    PERCENTILES,
    Level,
    Prompt,
    Reference,
    compare,
    count_tokens,
    level_figures,
    run_level,
)
from kvbench.benchmarks.servers import (
    ExternalServer,
    ManagedServer,
    RunningServer,
    ServerPool,
    ServerTarget,
    fill_port,
    free_port,
    kvbench_serve_command,
    parse_server,
)
from kvbench.data.text import parse_hf_source, resolve_text, text_tokens, tokens_sha256
from kvbench.methods.base import Method
from kvbench.models.info import ModelInfo
from kvbench.memo import Memo

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
KEEP_CHARS = 200  # of each text in a kept record of a differing response
TOP_LOGPROBS = 5  # candidates asked per token: what tells noise from another context


@dataclass
class StressParams:
    """Parameters of the stress benchmark (one concurrency level; a matrix over `users` makes
    the ladder).

    users: int = 1 — concurrent users, started together.
    requests_per_user: int = 2 — requests each user sends, one after another.
    prompts: int = 8 — distinct prompts: windows of `prompt_tokens` tokens of the text at offsets
        drawn with the case's seed. User u's j-th request asks prompt
        (u * requests_per_user + j) % prompts.
    prompt_tokens: int = 64 — tokens per prompt (the model's tokenizer).
    max_tokens: int = 32 — output tokens asked of every request (greedy: temperature 0).
    text: str = "pydoc" — "pydoc", a text file, or "hf:<dataset>[:<config>]:<split>:<column>".
    offset: int = 0 — the windows start at or after this token.
    api: "completions" | "chat" = "completions" — /v1/completions (a kvbench server gets the
        prompt's token ids, others its text) or /v1/chat/completions (one user message).
    server: "kvbench" | mapping = "kvbench" — "kvbench": kvbench starts `kvbench serve` with
        the case's model and method on a free loopback port (one server per method setting,
        kept for the method's next case, its log beside the results). {command: [...], url: ...}:
        kvbench starts `command` the same way ("{port}" in command and url is filled with a
        free port). {url: ...}: a server someone else runs. Optional keys: model (the `model`
        sent in requests; default: left out, except the suite's model for kvbench), logprobs
        (true: ask for top-2 logprobs, which tell float noise from real differences; kvbench
        servers always get them), ready_timeout_s (300). Hosts other than 127.0.0.1, localhost
        and ::1 are refused.
    kv_budget: int = 0 — bytes of KV cache `kvbench serve` may hold over all sessions
        (--kv-budget); 0 = none. sessions_held is how many it held at once.
    request_timeout_s: float = 120 — a request not finished by then fails.
    level_timeout_s: float = 900 — the whole level is cut here: requests still running or not
        sent fail.
    tie_margin: float = 0.05 — nats: a response that first differs from the single-user answer
        where that answer's top-1 led its top-2 by at most this is float noise, not flagged.
    shift_nats: float = 2.0 — nats: so is one whose candidates there are the answer's, perturbed:
        each side's token listed by the other (top 5) and no shared candidate's logprob moved by
        more than this (see responses_flagged). Sound 3- and 4-bit caches move by up to ~2: fed
        the same tokens, batched and single-user decode through intq4 on the bundled model
        differed by up to 1.9 in a logit within 30 steps (rounding flips accumulate).
    ignore_eos: bool = True — ask kvbench servers (ignore_eos, a vLLM-style extension) for
        exactly max_tokens tokens; other servers are not sent it.
    """

    users: int = 1
    requests_per_user: int = 2
    prompts: int = 8
    prompt_tokens: int = 64
    max_tokens: int = 32
    text: str = "pydoc"
    offset: int = 0
    api: Literal["completions", "chat"] = "completions"
    server: str | dict[str, Any] = "kvbench"
    kv_budget: int = 0
    request_timeout_s: float = 120.0
    level_timeout_s: float = 900.0
    tie_margin: float = 0.05
    shift_nats: float = 2.0
    ignore_eos: bool = True

    def __post_init__(self):
        check_at_least(self, {"users": 1, "requests_per_user": 1, "prompts": 1,
                              "prompt_tokens": 1, "max_tokens": 1, "offset": 0, "kv_budget": 0})
        for name in ("request_timeout_s", "level_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("tie_margin", "shift_nats"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.text.startswith("hf:"):
            parse_hf_source(self.text)
        target = parse_server(self.server)  # ValueError naming `server`; loopback only
        if self.kv_budget and target.kind != "kvbench":
            raise ValueError("kv_budget is passed to kvbench serve: it needs server: kvbench")

    @property
    def target(self) -> ServerTarget:
        return parse_server(self.server)


def _p(name: str, what: str) -> dict[str, MetricSpec]:
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
    **_p("ttft_s", "time to first token: request sent to the first stream chunk that carries"
         " a token"),
    **_p("tpot_s", "time per output token after the first: (e2e - ttft) / (output tokens - 1),"
         " per request with at least 2 tokens"),
    **_p("chunk_gap_s", "the gap between consecutive token-carrying stream chunks, pooled over"
         " requests (a chunk may carry more than one token on some servers)"),
    **_p("e2e_s", "end-to-end latency: request sent to its response finished"),
    "wall_s": MetricSpec("s", "lower", "the level's wall time: its first request sent to its"
                         " last response finished (failed ones included)", timing="absolute"),
    "requests": MetricSpec("", "none", "requests planned at the level (users x"
                           " requests_per_user, times the repeats)"),
    "errors": MetricSpec(
        "", "lower", "failed requests: a non-200 status, an exception, a timeout, a stream with"
        " no token, or not sent before level_timeout_s (info.failures says why)"),
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
}
# Figures of one level pass that are medians over repeats (the rest are totals, see METRICS).
_PER_PASS = [name for name, spec in METRICS.items() if spec.timing is not None]


@register_benchmark("stress")
class Stress(Benchmark):
    """Concurrent users against an OpenAI-compatible server on loopback (kvbench serve with the
    case's method, or another server): throughput, TTFT/TPOT/chunk-gap/e2e percentiles, errors,
    answers against the single-user answers, sessions held. One level (users) per case."""

    Params = StressParams
    metrics = METRICS
    uses_model = True

    def resolve_paths(self, params: StressParams, base_dir: Path) -> StressParams:
        from dataclasses import replace

        return replace(params, text=resolve_text(params.text, base_dir))

    def check(self, params: StressParams, model: ModelInfo | None) -> None:
        self.check_text_and_model(params.text, model)
        self.check_length(model, "prompt_tokens + max_tokens",
                          params.prompt_tokens + params.max_tokens)

    def run(self, params: StressParams, method: Method, ctx: RunContext) -> BenchmarkOutput:
        target = params.target
        tokenizer = client_tokenizer(ctx.memo, ctx.model)
        prompts = ctx.memo.get(
            ("stress_prompts", ctx.model, params.text, params.offset, params.prompts,
             params.prompt_tokens, ctx.seed),
            lambda: make_prompts(ctx.memo, tokenizer, ctx.model, params, ctx.seed))
        prompts_sha = tokens_sha256([t for p in prompts for t in [-1, *p.ids]])
        key, server, info = self._server(ctx, params, method, target)
        model_name = ctx.model if target.kind == "kvbench" else target.model
        body = partial(request_body, params, target, model_name)
        path = PATHS[params.api]
        level = partial(run_level, server.url, path, prompts, body=body,
                        request_timeout_s=params.request_timeout_s,
                        level_timeout_s=params.level_timeout_s)
        if not server.warmed:  # the first request pays one-time costs: not in any figure
            ctx.status("warm-up request")
            warm = level(users=1, requests_per_user=1)
            server.warmed = True
            if warm.records[0].error:
                info["warmup_error"] = warm.records[0].error
        ctx.status(f"single-user reference ({params.prompts} prompts)")
        reference = ctx.memo.get(
            ("stress_reference", key, prompts_sha, params.api, params.max_tokens,
             params.ignore_eos, params.request_timeout_s),
            lambda: reference_pass(level, prompts, tokenizer))
        passes = []
        for repeat in range(ctx.repeats):
            ctx.status(f"{params.users} users, repeat {repeat + 1}/{ctx.repeats}")
            passes.append(level(users=params.users,
                                requests_per_user=params.requests_per_user))
        metrics, summary = self._figures(passes, reference, tokenizer, params, ctx)
        info.update(summary)
        info.update({
            "single_user_tok_s": reference.output_tok_s,
            "kv_budget": params.kv_budget,
            "percentiles": f"numpy.percentile, method '{PERCENTILE_METHOD}'",
        })
        return BenchmarkOutput(
            metrics=metrics, info=info,
            comparable={"prompts_sha256": prompts_sha, "model": str(ctx.model),
                        "server": target.kind if target.kind == "kvbench"
                        else json.dumps(params.server, sort_keys=True)})

    # ---- the server --------------------------------------------------------------------------

    def _server(self, ctx: RunContext, params: StressParams, method: Method,
                target: ServerTarget) -> tuple[tuple, RunningServer, dict[str, Any]]:
        """(the server's key, the running server, what info says of it)."""
        import torch

        if target.kind == "kvbench":
            name, method_params = method_name(method), json.dumps(
                method.params(), sort_keys=True, default=str)
            key = ("kvbench", ctx.model, name, method_params, params.kv_budget,
                   torch.get_num_threads(), str(ctx.device))
            label = f"kvbench-serve-{name}"
        else:
            key = (target.kind, target.command, target.url)
            label = f"{target.kind}-{Path(target.command[0]).name if target.command else ''}"
        info: dict[str, Any] = {"server": target.describe(),
                                "server_uses_method": target.kind == "kvbench"}
        if target.kind == "url":
            make = partial(ExternalServer, target.url, target.describe())
        else:
            make = partial(self._start, ctx, params, method, target, label, key)
        pool = ctx.memo.get(("stress_servers",), ServerPool)
        server, fresh = pool.acquire(key, make)
        info["server_log"] = None if server.log_path is None else str(server.log_path)
        if getattr(server, "log_note", ""):
            info["server_log_note"] = server.log_note
        info["server_started_for_this_case"] = fresh
        if fresh and isinstance(server, ManagedServer):
            info["server_ready_s"] = server.ready_s
            info["server_command"] = server.command
        return key, server, info

    @staticmethod
    def _log_path(ctx: RunContext, label: str, key: tuple) -> tuple[Path, str]:
        """(where a started server's log goes, a note when that is not beside the results)."""
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:8]
        name = re.sub(r"[^\w.-]+", "_", label)[:80] + f"-{digest}.log"
        if ctx.files_dir is not None:
            return Path(ctx.files_dir) / name, ""
        folder = Path(tempfile.mkdtemp(prefix="kvbench-stress-"))
        return folder / name, "no run folder (outside a run): the server's log is a temp file"

    @staticmethod
    def _start(ctx: RunContext, params: StressParams, method: Method, target: ServerTarget,
               label: str, key: tuple) -> ManagedServer:
        import torch

        log, note = Stress._log_path(ctx, label, key)
        port = free_port()
        env = {}
        if target.kind == "kvbench":
            command = kvbench_serve_command(
                str(ctx.model), method_name(method),
                json.dumps(method.params(), sort_keys=True, default=str), port,
                ctx.device.type, torch.get_num_threads(), params.kv_budget)
            url = f"http://127.0.0.1:{port}"
            root = import_root(type(method))
            if root is not None:  # a module:Class method: the server imports it from there
                env["PYTHONPATH"] = _path_join(root, os.environ.get("PYTHONPATH", ""))
            description = f"kvbench serve {method_name(method)} on 127.0.0.1:{port}"
        else:
            command = [fill_port(part, port) for part in target.command]
            url = fill_port(target.url, port)
            description = target.describe()
        server = ManagedServer(command, url, log, description, env, target.ready_timeout_s)
        server.log_note = note
        return server.start()

    # ---- the figures -------------------------------------------------------------------------

    def _figures(self, passes: list[Level], reference: "SingleUser", tokenizer: Any,
                 params: StressParams, ctx: RunContext) -> tuple[dict, dict[str, Any]]:
        per_pass, agreements = [], []
        differing = flagged = 0
        failures: dict[str, int] = {}
        sources: dict[str, int] = {}
        id_sources: dict[str, int] = {}
        sent = ok = 0
        timed_out = False
        for repeat, level in enumerate(passes):
            records = level.records
            count_tokens(records, tokenizer)
            figures = level_figures(records, level.users)
            figures["aggregate_vs_single"] = figures["output_tok_s"] / reference.output_tok_s
            figures["per_user_vs_single"] = figures["per_user_tok_s"] / reference.output_tok_s
            per_pass.append(figures)
            timed_out |= level.timed_out
            for record in records:
                sent += record.sent
                if not record.ok:
                    reason = record.error.splitlines()[0] if record.error else "failed"
                    failures[reason] = failures.get(reason, 0) + 1
                    continue
                ok += 1
                sources[record.count_source] = sources.get(record.count_source, 0) + 1
                id_sources[record.ids_source] = id_sources.get(record.ids_source, 0) + 1
                answer = reference.answers[record.prompt]
                result = compare(record.ids, answer, params.tie_margin, params.shift_nats, record.tops)
                agreements.append(result.agreement)
                if result.identical:
                    continue
                differing += 1
                flagged += result.flagged
                ctx.keep({
                    "users": params.users, "repeat": repeat, "user": record.user,
                    "turn": record.turn, "prompt": record.prompt,
                    "agreement": result.agreement,
                    "first_difference": result.first_difference,
                    "margin_there": result.margin, "difference": result.kind,
                    "flagged": result.flagged,
                    "candidates_there": candidates_at(answer.tops, result.first_difference),
                    "response_candidates_there": candidates_at(record.tops, result.first_difference),
                    "response": record.text[:KEEP_CHARS],
                    "single_user": answer.text[:KEEP_CHARS],
                })
        m = self.metrics
        metrics = {name: _median_metric(m[name], [f[name] for f in per_pass])
                   for name in _PER_PASS}
        totals = {
            "requests": sum(f["requests"] for f in per_pass),
            "errors": sum(f["errors"] for f in per_pass),
            "output_tokens": sum(f["output_tokens"] for f in per_pass),
            "token_agreement": statistics.fmean(agreements) if agreements else math.nan,
            "responses_differing": differing,
            "responses_flagged": flagged,
            "sessions_held": statistics.median(f["sessions_held"] for f in per_pass),
        }
        metrics.update({name: m[name].of(value) for name, value in totals.items()})
        metrics = {name: metrics[name] for name in METRICS}  # the table's order
        summary = {
            "requests_summary": {"planned": int(totals["requests"]), "sent": sent, "ok": ok,
                                 "failed": int(totals["errors"])},
            "failures": failures,
            "level_timed_out": timed_out,
            "token_count_source": sources,
            "token_ids_source": id_sources,
            "logprobs": reference.has_logprobs,
            "repeats": len(passes),
        }
        return metrics, summary


def _median_metric(spec: MetricSpec, values: list[float]):
    """The repeats' median with its samples; NaN when any repeat's is NaN (no successful
    request to time)."""
    if not all(math.isfinite(v) for v in values):
        return spec.of(math.nan)
    return spec.of_samples(values)


# ---- prompts, tokenizer, requests, the single-user reference -----------------------------------

def client_tokenizer(memo: Memo, spec: str | None) -> Any:
    """The suite's model's tokenizer alone (no weights: the server has the model), once per
    run."""
    if spec is None:
        raise ValueError("stress needs a model (its tokenizer makes the prompts and counts"
                         " tokens); set the suite's model")
    from kvbench.models.loading import load_tokenizer

    return memo.get(("stress_tokenizer", spec), lambda: load_tokenizer(spec))


class _TokenizerOnly:
    """What kvbench.data.text.text_tokens asks of a session: a tokenizer and a memo key."""

    def __init__(self, tokenizer: Any, spec: str):
        self.tokenizer, self.memo_key = tokenizer, ("tokenizer", spec)


def make_prompts(memo: Memo, tokenizer: Any, spec: str, params: StressParams,
                 seed: int) -> list[Prompt]:
    """`params.prompts` windows of `prompt_tokens` tokens of the text, at distinct offsets from
    `params.offset` on, drawn with `seed`."""
    tokens = text_tokens(memo, _TokenizerOnly(tokenizer, spec), params.text)
    starts = len(tokens) - params.prompt_tokens - params.offset + 1
    if starts < params.prompts:
        raise ValueError(f"text {params.text!r} has {len(tokens)} tokens: too few for"
                         f" {params.prompts} distinct windows of {params.prompt_tokens} tokens"
                         f" from offset {params.offset}")
    offsets = Random(seed).sample(range(params.offset, params.offset + starts), params.prompts)
    prompts = []
    for index, start in enumerate(offsets):
        ids = list(tokens[start : start + params.prompt_tokens])
        prompts.append(Prompt(index, tokenizer.decode(ids), ids))
    return prompts


def request_body(params: StressParams, target: ServerTarget, model: str | None,
                 prompt: Prompt) -> dict[str, Any]:
    """One streamed greedy request. A kvbench server gets the prompt's token ids (completions),
    top-2 logprobs, and the token_ids / ignore_eos extensions; another server the standard
    fields only (logprobs when its mapping asks)."""
    kvbench = target.kind == "kvbench"
    body: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    logprobs = kvbench or target.logprobs
    if params.api == "completions":
        body["prompt"] = prompt.ids if kvbench else prompt.text
        if logprobs:
            body["logprobs"] = TOP_LOGPROBS
    else:
        body["messages"] = [{"role": "user", "content": prompt.text}]
        if logprobs:
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
    if kvbench:
        body["return_token_ids"] = True
        if params.ignore_eos:
            body["ignore_eos"] = True
    return body


@dataclass
class SingleUser:
    """The single-user reference pass: each prompt's answer, and the pass's output tok/s."""

    answers: dict[int, Reference]
    output_tok_s: float
    has_logprobs: bool


def reference_pass(level: Any, prompts: list[Prompt], tokenizer: Any) -> SingleUser:
    """Every prompt once, one request at a time (one user asking them in order); RuntimeError
    naming the failures when any fails (nothing can be compared without them)."""
    run = level(users=1, requests_per_user=len(prompts))
    records = run.records
    failed = [f"prompt {r.prompt}: {r.error}" for r in records if not r.ok]
    if failed:
        raise RuntimeError("the single-user reference pass failed, so no response can be"
                           " compared: " + "; ".join(failed[:5]))
    count_tokens(records, tokenizer)
    answers = {r.prompt: Reference(r.ids, r.text, r.tops) for r in records}
    empty = [p for p, a in answers.items() if not a.ids]
    if empty:
        raise RuntimeError(f"the single-user answers to prompts {empty} have no tokens")
    rate = level_figures(records, 1)["output_tok_s"]
    return SingleUser(answers, rate, all(a.tops is not None for a in answers.values()))


def method_name(method: Method) -> str:
    """The name `kvbench serve --method` builds the method from: its registered name, else
    module:Class."""
    cls = type(method)
    return cls.__dict__.get("name") or f"{cls.__module__}:{cls.__qualname__}"


def import_root(cls: type) -> str | None:
    """The sys.path folder a class outside kvbench was imported from (a server started with
    the class's module:Class imports it from there); None for kvbench's own."""
    if cls.__module__.split(".")[0] == "kvbench":
        return None
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    depth = cls.__module__.count(".") + (2 if Path(file).name == "__init__.py" else 1)
    return str(Path(file).resolve().parents[depth - 1])


def _path_join(*parts: str) -> str:
    return os.pathsep.join(p for p in parts if p)
