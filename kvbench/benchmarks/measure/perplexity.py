"""`perplexity`: the continuation is scored through the method's cache, never around it.

Protocol: prefill `context` tokens through the method's cache (a KVBenchCache on torch, its twin
on mlx-lm) in one forward, call end_prefill() (compaction methods compress here), then decode the
continuation through the same cache `decode_chunk` tokens at a time. Token i is scored from the
logits at position i-1; the first continuation token from the prefill's last logits. The
reference is the same protocol with the plain cache (transformers DynamicCache, mlx-lm KVCache)
on the same tokens and backend, run in lockstep with the method's: each prefill and each decode
step feeds the plain cache and then the method's, so the speed ratios between the two compare
work done moments apart, under the same load on the machine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.perplexity import DECODE_SEGMENT, Perplexity, PerplexityParams
from kvbench.data.text import tokens_sha256
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, plain_kv_bytes, prefill

@dataclass
class _Pass:
    """One cache's run over the window: its NLL sum, prefill time and decode times."""

    cache: Any
    nll: float = 0.0
    prefill_s: float = 0.0  # the prefill's forwards plus end_prefill
    segment_s: list[float] = field(default_factory=list)  # per DECODE_SEGMENT steps
    segment_tokens: list[int] = field(default_factory=list)

    def ppl(self, scored: int) -> float:
        return math.exp(self.nll / scored)


@measures(Perplexity)
class PerplexityRun(Perplexity):
    def run(self, params: PerplexityParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session, window, calibration = ctx.open_window(params, params.context + params.continuation)
        ctx.status("calibrate")
        session.calibrate(method, calibration)
        runs: list[tuple[_Pass, _Pass]] = []
        session.reset_peak_memory()
        for _ in range(ctx.repeats):
            runs.append(_run_lockstep(session, window, params, method, ctx.seed, ctx.status))
        scored = len(window) - params.context
        reference = runs[0][0].ppl(scored)
        ppl = runs[0][1].ppl(scored)
        for plain, mine in runs:
            # Fresh caches on the same tokens must agree; otherwise state leaks between runs.
            if not (math.isclose(mine.ppl(scored), ppl, rel_tol=1e-6)
                    and math.isclose(plain.ppl(scored), reference, rel_tol=1e-6)):
                raise RuntimeError("perplexity differs across repeats: "
                                   f"{[(p.ppl(scored), q.ppl(scored)) for p, q in runs]}")

        peak_bytes, peak_what = session.peak_memory()
        cache = runs[-1][1].cache
        kv_bytes = cache.accounted_bytes()
        bytes_16bit, bytes_plain = plain_kv_bytes(session, cache)
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
        segments = [(p_s, q_s, n) for plain, mine in runs
                    for p_s, q_s, n in zip(plain.segment_s, mine.segment_s, mine.segment_tokens)]
        return BenchmarkOutput(
            metrics={
                "perplexity": m["perplexity"].of(ppl),
                "ppl_reference": m["ppl_reference"].of(reference),
                "ppl_rel_delta": m["ppl_rel_delta"].of((ppl - reference) / reference),
                "kv_bytes": m["kv_bytes"].of(kv_bytes),
                "kv_bytes_measured": m["kv_bytes_measured"].of(cache.measured_bytes()),
                "compression_ratio": m["compression_ratio"].of(bytes_16bit / kv_bytes),
                "retained_kv": m["retained_kv"].of(kv_bytes / bytes_plain),
                "prefill_s": m["prefill_s"].of_samples([mine.prefill_s for _, mine in runs]),
                "decode_tok_s": m["decode_tok_s"].of_samples([n / q_s for _, q_s, n in segments]),
                "prefill_s_vs_plain": m["prefill_s_vs_plain"].of_samples(
                    [mine.prefill_s / plain.prefill_s for plain, mine in runs]),
                "decode_tok_s_vs_plain": m["decode_tok_s_vs_plain"].of_samples(
                    [p_s / q_s for p_s, q_s, _ in segments]),
                **sparse,
            },
            info={
                "layout": method.layout(),
                "tokens": len(window),
                "text": params.text,
                "peak_memory_bytes": peak_bytes,
                "peak_memory": f"{peak_what}; the plain reference cache, run in lockstep,"
                               " included",
                **counters,
            },
            comparable={"tokens_sha256": tokens_sha256(window), "model": session.spec,
                        "model_dtype": session.dtype},
        )


def _run_lockstep(
    session: Session, window: list[int], params: PerplexityParams, method: Implementation,
    seed: int, status: Callable[[str], None],
) -> tuple[_Pass, _Pass]:
    """(the plain cache's pass, the method's): prefill (and `method`'s reference probe),
    end_prefill, then decode and score, each step first through the plain cache, then through
    the method's."""
    plain = _Pass(session.new_cache(None))
    torch.manual_seed(seed)  # methods drawing random rotations draw the same ones every repeat
    mine = _Pass(session.new_cache(method))
    context, total, chunk = params.context, len(window), params.decode_chunk
    status("prefill")
    for run, run_method in ((plain, None), (mine, method)):
        logits, forward_s, compact_s = prefill(session, run.cache, window[:context], run_method)
        run.prefill_s = forward_s + compact_s
        run.nll = _nll_sum(logits, window[context : context + 1])

    # The last token is only scored, never fed: its logits are not needed.
    starts = range(context, total - 1, chunk)
    for i, start in enumerate(starts):
        status(f"decode {i + 1}/{len(starts)}")
        end = min(start + chunk, total - 1)
        if i % DECODE_SEGMENT == 0:
            for run in (plain, mine):
                run.segment_s.append(0.0)
                run.segment_tokens.append(0)
        for run in (plain, mine):
            logits, seconds = session.step(window[start:end], run.cache)
            run.segment_s[-1] += seconds
            run.segment_tokens[-1] += end - start
            run.nll += _nll_sum(logits, window[start + 1 : end + 1])
    return plain, mine


def _nll_sum(logits: torch.Tensor, targets: list[int]) -> float:
    return F.cross_entropy(logits.double(), torch.tensor(targets), reduction="sum").item()
