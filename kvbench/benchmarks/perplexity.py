"""`perplexity`: the continuation is scored through the method's cache, never around it.

Protocol: prefill `context` tokens through the method's cache (a KVBenchCache on torch, its twin
on mlx-lm) in one forward, call end_prefill() (compaction methods compress here), then decode the
continuation through the same cache `decode_chunk` tokens at a time. Token i is scored from the
logits at position i-1; the first continuation token from the prefill's last logits. The
reference is the same protocol with the plain cache (transformers DynamicCache, mlx-lm KVCache)
on the same tokens and backend.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from kvbench.benchmarks.base import (
    BenchmarkOutput,
    MetricSpec,
    RunContext,
    TextModelBenchmark,
    check_at_least,
    register_benchmark,
)
from kvbench.data.text import parse_hf_source, token_window, tokens_sha256
from kvbench.methods.base import Method
from kvbench.models.session import Session, open_session, prefill
from kvbench.models.info import ModelInfo

# Lives for the process: every case of a run shares one reference per token window.
_REFERENCE: dict[tuple, float] = {}


@dataclass
class PerplexityParams:
    """Parameters of the perplexity benchmark.

    context: int = 1024 — prompt tokens prefilled into the cache.
    continuation: int = 256 — tokens scored through the cache (at least 2: one decode step).
    text: str = "pydoc" — "pydoc", a text file, or "hf:<dataset>[:<config>]:<split>:<column>".
    offset: int = 0 — token offset into the tokenised text.
    decode_chunk: int = 1 — tokens per decode step; 1 is true token-by-token decode.
    calibration: int = 512 — tokens right after the scored ones, handed to methods that
        calibrate themselves (never the scored tokens).
    """

    context: int = 1024
    continuation: int = 256
    text: str = "pydoc"
    offset: int = 0
    decode_chunk: int = 1
    calibration: int = 512

    def __post_init__(self):
        check_at_least(self, {"context": 1, "continuation": 2, "decode_chunk": 1, "offset": 0,
                              "calibration": 0})
        if self.text.startswith("hf:"):
            parse_hf_source(self.text)  # a malformed source is refused before anything runs


@dataclass
class _Pass:
    ppl: float
    prefill_s: float
    decode_s: float


@register_benchmark("perplexity")
class Perplexity(TextModelBenchmark):
    """Perplexity of a continuation read through the method's cache, against the plain model."""

    Params = PerplexityParams
    metrics = {
        "perplexity": MetricSpec("ppl", "lower", "exp(mean NLL) of the continuation via the cache"),
        "ppl_reference": MetricSpec("ppl", "none", "the plain model (DynamicCache), same tokens"),
        "ppl_rel_delta": MetricSpec("", "lower", "(perplexity - ppl_reference) / ppl_reference"),
        "kv_bytes": MetricSpec("bytes", "lower", "accounted K+V bytes kept at the end, all layers"),
        "kv_bytes_measured": MetricSpec("bytes", "lower", "bytes of the tensors the cache holds"),
        "compression_ratio": MetricSpec("x", "higher", "16-bit K+V of all tokens seen / kv_bytes"),
        "retained_kv": MetricSpec("x", "lower", "kv_bytes / the plain cache's K+V bytes of all"
                                  " tokens seen, at the model's dtype"),
        "prefill_s": MetricSpec("s", "lower", "prefill forward plus end_prefill", timed=True),
        "decode_tok_s": MetricSpec("tok/s", "higher", "decoded tokens per second", timed=True),
        # Only for methods with sparse-V (their caches count what they skipped):
        "values_skipped": MetricSpec("", "none", "fraction of value rows skipped at decode"),
        "sparse_v_output_error": MetricSpec(
            "", "lower", "mean relative squared error of decode attention outputs vs dense"),
    }

    def check(self, params: PerplexityParams, model: ModelInfo | None) -> None:
        self.check_text_and_model(params, model)
        self.check_length(model, f"context + continuation = {params.context} +"
                                 f" {params.continuation}", params.context + params.continuation)

    def run(self, params: PerplexityParams, method: Method, ctx: RunContext) -> BenchmarkOutput:
        session = open_session(ctx)
        window, calibration = _windows(session, params)
        sha = tokens_sha256(window)

        key = (session.spec, sha, params.context, params.decode_chunk, str(ctx.device),
               ctx.backend)
        if key not in _REFERENCE:
            ctx.status("reference")
            _REFERENCE[key] = _run_pass(session, window, params, session.new_cache(None)).ppl
        reference = _REFERENCE[key]

        ctx.status("calibrate")
        session.calibrate(method, calibration)
        passes, cache = [], None
        session.reset_peak_memory()
        for _ in range(ctx.repeats):
            torch.manual_seed(ctx.seed)  # methods drawing random rotations draw the same ones
            cache = session.new_cache(method)
            passes.append(_run_pass(session, window, params, cache, ctx.status, method))
        ppl = passes[0].ppl
        if any(not math.isclose(p.ppl, ppl, rel_tol=1e-6) for p in passes):
            # Fresh caches on the same tokens must agree; otherwise state leaks between runs.
            raise RuntimeError(f"perplexity differs across repeats: {[p.ppl for p in passes]}")

        peak_bytes, peak_what = session.peak_memory()
        kv_bytes = cache.accounted_bytes()
        # Against every token seen, so a method that evicts is credited with what it dropped.
        seen = sum(policy.seen_tokens for policy in cache.policies)
        bytes_16bit = 2 * 2 * session.num_kv_heads * session.head_dim * seen
        bytes_plain = bytes_16bit // 2 * session.kv_element_size
        decode_tok_s = [(params.continuation - 1) / p.decode_s for p in passes]
        m = self.metrics
        counters = cache.counters()
        sparse = {}
        if counters.get("sparse_v_rows"):
            sparse = {
                "values_skipped": m["values_skipped"].of(
                    counters["sparse_v_rows_skipped"] / counters["sparse_v_rows"]),
                "sparse_v_output_error": m["sparse_v_output_error"].of(
                    counters["sparse_v_output_error_sum"] / counters["sparse_v_steps"]),
            }
        return BenchmarkOutput(
            metrics={
                "perplexity": m["perplexity"].of(ppl),
                "ppl_reference": m["ppl_reference"].of(reference),
                "ppl_rel_delta": m["ppl_rel_delta"].of((ppl - reference) / reference),
                "kv_bytes": m["kv_bytes"].of(kv_bytes),
                "kv_bytes_measured": m["kv_bytes_measured"].of(cache.measured_bytes()),
                "compression_ratio": m["compression_ratio"].of(bytes_16bit / kv_bytes),
                "retained_kv": m["retained_kv"].of(kv_bytes / bytes_plain),
                "prefill_s": m["prefill_s"].of_samples([p.prefill_s for p in passes]),
                "decode_tok_s": m["decode_tok_s"].of_samples(decode_tok_s),
                **sparse,
            },
            info={
                "layout": method.layout(),
                "tokens": len(window),
                "text": params.text,
                "peak_memory_bytes": peak_bytes,
                "peak_memory": peak_what,
                **counters,
            },
            comparable={"tokens_sha256": sha, "model": session.spec},
        )


def _windows(session, params: PerplexityParams) -> tuple[list[int], list[int]]:
    """The context + continuation tokens the case scores, and the calibration tokens after them
    (as many of `params.calibration` as the text has)."""
    window, after = token_window(session, params.text, params.offset,
                                 params.context + params.continuation)
    return window, after[: params.calibration]


def _run_pass(
    session: Session, window: list[int], params: PerplexityParams, cache,
    status: Callable[[str], None] = lambda message: None, method: Method | None = None,
) -> _Pass:
    """Prefill (and `method`'s reference probe), end_prefill, then decode and score through
    `cache`."""
    context, total, chunk = params.context, len(window), params.decode_chunk
    status("prefill")
    logits, forward_s, compact_s = prefill(session, cache, window[:context], method)
    prefill_s = forward_s + compact_s
    nll = _nll_sum(logits, window[context : context + 1])

    # The last token is only scored, never fed: its logits are not needed.
    starts = range(context, total - 1, chunk)
    decode_s = 0.0
    for i, start in enumerate(starts):
        status(f"decode {i + 1}/{len(starts)}")
        end = min(start + chunk, total - 1)
        logits, seconds = session.step(window[start:end], cache)
        decode_s += seconds
        nll += _nll_sum(logits, window[start + 1 : end + 1])
    return _Pass(ppl=math.exp(nll / (total - context)), prefill_s=prefill_s, decode_s=decode_s)


def _nll_sum(logits: torch.Tensor, targets: list[int]) -> float:
    return F.cross_entropy(logits.double(), torch.tensor(targets), reduction="sum").item()
