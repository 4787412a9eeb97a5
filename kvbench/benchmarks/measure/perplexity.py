"""`perplexity`: the continuation is scored through the method's cache, never around it.

Protocol, per window of context + continuation tokens: prefill `context` tokens through the
method's cache (a KVBenchCache on torch, its twin on mlx-lm) in forwards of `prefill_chunk`
tokens (kvbench.benchmarks.measure.prefill_chunks; the plain reference alike), call end_prefill()
(compaction methods compress here), then decode the continuation through the same cache
`decode_chunk` tokens at a time. Token i is scored from the logits at position i-1; the first
continuation token from the prefill's last logits. Every window gets a fresh cache.

Windows: one at `offset`, or `windows` of them drawn with the case's seed
(kvbench.benchmarks.specs.perplexity.window_offsets), so every method of a run scores the same
windows. `perplexity` pools them: exp(total NLL / all scored tokens).

The plain reference is the same protocol with the plain cache (transformers DynamicCache, mlx-lm
KVCache) on the same tokens and backend, computed once per window, model and backend in a run and
shared by every method's case (the run's memo). identity at the model's dtype equals it bit for
bit (its claims ppl_rel_delta == 0 prove it), so a comparison against the plain reference is one
against identity: window by window, the method's NLL per scored token against the plain cache's
(kvbench.judge.paired.compare_paired: an exact sign test over the windows, lower is better, and a
seeded bootstrap of the mean difference, whose ends give ppl_rel_delta's interval).

With time_against_plain, the plain cache also runs in lockstep with the method's: each prefill
and each decode step feeds the plain cache and then the method's, so the speed ratios between
the two compare work done moments apart, under the same load on the machine. Without it no
plain decode is timed and the ratios are not reported.

With `server`, the same windows are scored behind an OpenAI-compatible server: `kvbench serve`
with the case's method (server: kvbench; sent the context as prefill_tokens, it runs the
protocol above with decode_chunk 1), or another engine (llama.cpp with its quantized KV cache,
say). Each window is one request with the prompt as token ids and its logprobs echoed
(kvbench.benchmarks.measure.prompt_logprobs), and the NLL sums go through the same arithmetic,
against the same in-process plain reference. The server is the run's, shared with stress cases
that name the same command (kvbench.benchmarks.measure.servers).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.measure.prefill_chunks import case_prefill_chunk
from kvbench.benchmarks.measure.prompt_logprobs import (
    ScoringError, continuation_nll, prompt_logprobs,
)
from kvbench.benchmarks.measure.kvbench_serve import (
    ServeOptions, kvbench_server, kvbench_server_impl,
)
from kvbench.benchmarks.measure.servers import pooled_server
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.perplexity import (
    DECODE_SEGMENT, Perplexity, PerplexityParams, window_offsets,
)
from kvbench.data.text import text_tokens, token_window, tokens_sha256
from kvbench.judge.paired import compare_paired, paired_interval
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, plain_kv_bytes, prefill
from kvbench.models.shared_prefill import forwards_chunk


@dataclass
class _Pass:
    """One cache's run over a window: its NLL sum, prefill time and decode times."""

    cache: Any
    nll: float = 0.0
    prefill_s: float = 0.0  # the prefill's forwards plus end_prefill
    segment_s: list[float] = field(default_factory=list)  # per DECODE_SEGMENT steps
    segment_tokens: list[int] = field(default_factory=list)

    def ppl(self, scored: int) -> float:
        return math.exp(self.nll / scored)


@dataclass
class _Kept:
    """What the method's cache held at the end of one window (the cache itself is let go)."""

    accounted: int
    measured: int
    bytes_16bit: int
    bytes_plain: int
    counters: dict[str, float]


@measures(Perplexity)
class PerplexityRun(Perplexity):
    def run(self, params: PerplexityParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session = ctx.open_session()
        need = params.context + params.continuation
        # Refused here, before any model work, when the windows do not fit the text.
        offsets = window_offsets(params, len(text_tokens(ctx.memo, session, params.text)),
                                 ctx.seed)
        read = [token_window(ctx.memo, session, params.text, offset, need) for offset in offsets]
        windows = [window for window, _ in read]
        comparable = {"tokens_sha256": tokens_sha256([t for w in windows for t in w]),
                      "model": session.spec, "model_dtype": session.dtype}
        if params.target is not None:
            return self._through_server(params, method, ctx, session, offsets, windows,
                                        comparable)
        calibration = read[-1][1][: params.calibration]  # after the last window
        ctx.status("calibrate")
        session.calibrate(method, calibration)
        chunk = case_prefill_chunk(ctx, session, method, params.prefill_chunk, params.context)
        plain_nll = [_plain_nll(ctx, session, params, i, windows, chunk)
                     for i in range(len(windows))]

        session.reset_peak_memory()
        nll, timed, kept = _method_passes(session, windows, params, method, ctx, plain_nll,
                                          chunk)
        figures, info = _perplexity_figures(self.metrics, params, offsets, nll[0], plain_nll,
                                            ctx.seed)
        peak_bytes, peak_what = session.peak_memory()
        m = self.metrics
        counters = _mean_counters(kept)
        lockstep = ("; the plain reference cache, run in lockstep, included"
                    if params.time_against_plain else "")
        return BenchmarkOutput(
            metrics={
                **figures,
                **_bytes_metrics(m, kept, counters),
                **_timing_metrics(m, timed, params.time_against_plain),
            },
            info={"layout": method.layout(), **info, "prefill_chunk": chunk,
                  "peak_memory_bytes": peak_bytes,
                  "peak_memory": f"{peak_what}{lockstep}",
                  **counters},
            comparable=comparable,
        )

    def _through_server(self, params: PerplexityParams, method: Implementation,
                        ctx: RunContext, session: Session, offsets: list[int],
                        windows: list[list[int]], comparable: dict[str, Any]) -> BenchmarkOutput:
        """The windows scored through params.server (see its meaning); the plain reference is
        still kvbench's, in process."""
        import httpx

        target = params.target
        plain_nll = [_plain_nll(ctx, session, params, i, windows, 0)
                     for i in range(len(windows))]
        uses_method = target.kind == "kvbench"
        if uses_method:
            # the context prefilled in one forward, as in process (the server chunks at 512)
            server, info = pooled_server(ctx.memo, ctx.files_dir, target, *kvbench_server(
                ctx, method, ServeOptions(prefill_chunk=params.context)))
        else:
            server, info = pooled_server(ctx.memo, ctx.files_dir, target)
        # kvbench serve splits the window where the benchmark does; others get no such field
        prefill_tokens = params.context if uses_method else None
        nll: list[list[float]] = []
        request_s: list[float] = []
        with httpx.Client(trust_env=False, headers=target.auth_headers()) as client:
            for repeat in range(ctx.repeats):
                nll.append([])
                for i, window in enumerate(windows):
                    _in_window(ctx.status, i, len(windows))(f"scored by the server (repeat"
                                                           f" {repeat + 1}/{ctx.repeats})")
                    started = time.perf_counter()
                    try:
                        logprobs = prompt_logprobs(client, server.url, window, target.model,
                                                   prefill_tokens)
                    except ScoringError as exc:
                        raise RuntimeError(f"window {i + 1} (offset {offsets[i]}): {exc}") \
                            from None
                    request_s.append(time.perf_counter() - started)
                    nll[-1].append(continuation_nll(logprobs, params.context))
        _check_repeats(nll)
        figures, more = _perplexity_figures(self.metrics, params, offsets, nll[0], plain_nll,
                                            ctx.seed)
        info.update(more)
        if uses_method:
            info["layout"] = method.layout()
            impl = kvbench_server_impl(server.url)
            if impl:  # what the server's codecs ran: kernels or torch
                info["impl"] = impl
        info.update({
            "server_uses_method": uses_method,
            "scored_by": "the server: each window one /v1/completions request (token ids,"
                         " echo, logprobs" + (", prefill_tokens = context: the context"
                                              " prefilled and compressed by the method"
                                              if uses_method else "")
                         + "), its continuation scored by the echoed logprobs",
            "request_s": request_s,
        })
        return BenchmarkOutput(
            metrics=figures, info=info,
            comparable={**comparable, "server": json.dumps(params.server, sort_keys=True)})


def _perplexity_figures(m: dict, params: PerplexityParams, offsets: list[int],
                        nll: list[float], plain_nll: list[float],
                        seed: int) -> tuple[dict, dict[str, Any]]:
    """(perplexity, ppl_reference, ppl_rel_delta and, over windows, its interval; what info
    says of the windows) from the NLL sums of each window's continuation, the method's (or the
    server's) and the plain model's. Windows pool: exp(total NLL / all scored tokens)."""
    scored = params.continuation * len(nll)
    ppl = math.exp(sum(nll) / scored)
    reference = math.exp(sum(plain_nll) / scored)
    info: dict[str, Any] = {
        "tokens": params.context + params.continuation,  # per window
        "text": params.text,
        "windows": [{"offset": offset, "nll": a, "nll_plain": b}
                    for offset, a, b in zip(offsets, nll, plain_nll)],
    }
    spread = {}
    if len(nll) > 1:
        spread, info["perplexity_interval"], info["vs_plain"] = _over_windows(
            m, nll, plain_nll, params.continuation, seed)
    return ({"perplexity": m["perplexity"].of(ppl),
             "ppl_reference": m["ppl_reference"].of(reference),
             "ppl_rel_delta": m["ppl_rel_delta"].of((ppl - reference) / reference),
             **spread}, info)


def _check_repeats(nll: list[list[float]]) -> None:
    """Fresh caches on the same tokens must agree; otherwise state leaks between runs."""
    for repeat in nll:
        if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(repeat, nll[0])):
            raise RuntimeError(f"perplexity differs across repeats: NLL per window {nll}")


def _method_passes(
    session: Session, windows: list[list[int]], params: PerplexityParams,
    method: Implementation, ctx: RunContext, plain_nll: list[float], chunk: int,
) -> tuple[list[list[float]], list[tuple[_Pass | None, _Pass]], list[_Kept]]:
    """Every repeat's pass over every window: (the method's NLL per repeat and window, the
    passes for their timings (the plain cache's in lockstep or None, the method's), what the
    caches of the last repeat kept per window). The passes let go of their caches."""
    nll: list[list[float]] = []
    timed: list[tuple[_Pass | None, _Pass]] = []
    kept: list[_Kept] = []
    for _ in range(ctx.repeats):
        nll.append([])
        kept.clear()
        for i, window in enumerate(windows):
            plain, mine = _run_lockstep(session, window, params, method, ctx.seed,
                                        _in_window(ctx.status, i, len(windows)), chunk)
            nll[-1].append(mine.nll)
            kept.append(_kept(session, mine.cache))
            for run in (plain, mine):
                if run is not None:
                    run.cache = None  # every window's cache would pile up
            timed.append((plain, mine))
            if plain is not None and not math.isclose(plain.nll, plain_nll[i], rel_tol=1e-6):
                raise RuntimeError(f"window {i + 1}: the plain cache in lockstep scored NLL"
                                   f" {plain.nll}, the shared plain reference {plain_nll[i]}")
    _check_repeats(nll)
    return nll, timed, kept


def _plain_nll(ctx: RunContext, session: Session, params: PerplexityParams, i: int,
               windows: list[list[int]], chunk: int) -> float:
    """The plain cache's NLL sum over window i's continuation, its context prefilled in
    forwards of `chunk` tokens as the method's: made once per window, model, backend and chunk
    in a run, shared by every method's case."""
    window = windows[i]

    def score() -> float:
        plain = _Pass(session.new_cache(None))
        status = _in_window(ctx.status, i, len(windows))
        _score(session, window, params, [(plain, None)], lambda text: status(f"reference {text}"),
               chunk)
        return plain.nll

    return ctx.memo.get(("perplexity.plain_nll", *session.memo_key, tokens_sha256(window),
                         params.context, params.decode_chunk,
                         forwards_chunk(chunk, params.context)), score)


def _in_window(status: Callable[[str], None], i: int, count: int) -> Callable[[str], None]:
    """The progress text of window i of `count` (no prefix for a single window)."""
    return status if count == 1 else lambda text: status(f"window {i + 1}/{count}: {text}")


def _run_lockstep(
    session: Session, window: list[int], params: PerplexityParams, method: Implementation,
    seed: int, status: Callable[[str], None], chunk: int,
) -> tuple[_Pass | None, _Pass]:
    """(the plain cache's pass in lockstep with the method's, or None without
    time_against_plain; the method's pass) over one window, each through a fresh cache."""
    plain = _Pass(session.new_cache(None)) if params.time_against_plain else None
    torch.manual_seed(seed)  # methods drawing random rotations draw the same ones every time
    mine = _Pass(session.new_cache(method))
    _score(session, window, params, ([(plain, None)] if plain else []) + [(mine, method)], status,
           chunk)
    return plain, mine


def _score(session: Session, window: list[int], params: PerplexityParams,
           runs: list[tuple[_Pass, Implementation | None]],
           status: Callable[[str], None], prefill_chunk: int) -> None:
    """Prefill in forwards of `prefill_chunk` tokens (and each method's reference probe),
    end_prefill, then decode and score the window through every run's cache in lockstep: each
    step feeds the runs in order."""
    context, total, chunk = params.context, len(window), params.decode_chunk
    status("prefill")
    for run, run_method in runs:
        session.reserve(run.cache, total - 1)  # the last token is only scored
        logits, forward_s, compact_s = prefill(session, run.cache, window[:context], run_method,
                                               chunk=prefill_chunk)
        run.prefill_s = forward_s + compact_s
        run.nll = _nll_sum(logits, window[context : context + 1])

    # The last token is only scored, never fed: its logits are not needed.
    starts = range(context, total - 1, chunk)
    for i, start in enumerate(starts):
        status(f"decode {i + 1}/{len(starts)}")
        end = min(start + chunk, total - 1)
        if i % DECODE_SEGMENT == 0:
            for run, _ in runs:
                run.segment_s.append(0.0)
                run.segment_tokens.append(0)
        for run, _ in runs:
            logits, seconds = session.step(window[start:end], run.cache)
            run.segment_s[-1] += seconds
            run.segment_tokens[-1] += end - start
            run.nll += _nll_sum(logits, window[start + 1 : end + 1])


def _nll_sum(logits: torch.Tensor, targets: list[int]) -> float:
    return F.cross_entropy(logits.double(), torch.tensor(targets), reduction="sum").item()


def _over_windows(m: dict, nll: list[float], plain_nll: list[float], scored: int,
                  seed: int) -> tuple[dict, list[float], dict[str, Any]]:
    """(ppl_rel_delta's interval metrics, perplexity's 95% interval, the paired comparison with
    the plain reference) over the windows. Every window scores as many tokens, so the pooled
    log perplexity is the mean of the per-window NLL per token and a bootstrap of that mean,
    exponentiated, is an interval of the pooled figures."""
    per_token = [a / scored for a in nll]
    paired = compare_paired(per_token, [b / scored for b in plain_nll], higher_is_better=False,
                            seed=seed)
    _, low, high = paired_interval(per_token, seed=seed)  # one series: a bootstrap of its mean
    return ({"ppl_rel_delta_ci_low": m["ppl_rel_delta_ci_low"].of(math.expm1(paired.low)),
             "ppl_rel_delta_ci_high": m["ppl_rel_delta_ci_high"].of(math.expm1(paired.high))},
            [math.exp(low), math.exp(high)],
            {"unit": "NLL per scored token (nats), method - plain",
             **dataclasses.asdict(paired)})


def _kept(session: Session, cache: Any) -> _Kept:
    bytes_16bit, bytes_plain = plain_kv_bytes(session, cache)
    return _Kept(cache.accounted_bytes(), cache.measured_bytes(), bytes_16bit, bytes_plain,
                 cache.counters())


def _mean_counters(kept: list[_Kept]) -> dict[str, float]:
    """The caches' counters, the mean over windows."""
    names = dict.fromkeys(name for k in kept for name in k.counters)
    return {name: sum(k.counters.get(name, 0.0) for k in kept) / len(kept) for name in names}


def _bytes_metrics(m: dict, kept: list[_Kept], counters: dict[str, float]) -> dict:
    """What the caches kept at the end of each window: bytes as the mean over windows, ratios
    of the totals; sparse-V's figures (from the `counters`) for methods that count what they
    skipped."""
    accounted = sum(k.accounted for k in kept)
    out = {
        "kv_bytes": m["kv_bytes"].of(accounted / len(kept)),
        "kv_bytes_measured": m["kv_bytes_measured"].of(sum(k.measured for k in kept) / len(kept)),
        "compression_ratio": m["compression_ratio"].of(sum(k.bytes_16bit for k in kept)
                                                       / accounted),
        "retained_kv": m["retained_kv"].of(accounted / sum(k.bytes_plain for k in kept)),
    }
    if counters.get("sparse_v_rows"):
        out["values_skipped"] = m["values_skipped"].of(
            counters["sparse_v_rows_skipped"] / counters["sparse_v_rows"])
        out["sparse_v_output_error"] = m["sparse_v_output_error"].of(
            counters["sparse_v_output_error_sum"] / counters["sparse_v_steps"])
    return out


def _timing_metrics(m: dict, timed: list[tuple[_Pass | None, _Pass]], lockstep: bool) -> dict:
    """Prefill per window and repeat, decode per DECODE_SEGMENT steps; with the plain cache in
    `lockstep`, each also as a ratio to the plain cache's over the same work."""
    out = {
        "prefill_s": m["prefill_s"].of_samples([mine.prefill_s for _, mine in timed]),
        "decode_tok_s": m["decode_tok_s"].of_samples(
            [n / s for _, mine in timed for s, n in zip(mine.segment_s, mine.segment_tokens)]),
    }
    if lockstep:
        pairs = [(plain, mine) for plain, mine in timed if plain is not None]
        out["prefill_s_vs_plain"] = m["prefill_s_vs_plain"].of_samples(
            [mine.prefill_s / plain.prefill_s for plain, mine in pairs])
        out["decode_tok_s_vs_plain"] = m["decode_tok_s_vs_plain"].of_samples(
            [p_s / q_s for plain, mine in pairs
             for p_s, q_s in zip(plain.segment_s, mine.segment_s)])
    return out
