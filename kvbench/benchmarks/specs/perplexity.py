"""`perplexity`: the continuation is scored through the method's cache, never around it
(the protocol: kvbench.benchmarks.measure.perplexity)."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.config.fields import at_least, param
from kvbench.benchmarks.reports.perplexity import REPORT
from kvbench.benchmarks.specs.base import (
    MetricSpec, TextModelBenchmark, TextWindowParams, register_benchmark,
)

# Decode steps per timing sample: a change of load on the machine spoils one sample, not the
# case's figure, and one pass gives enough samples for a significance test.
DECODE_SEGMENT = 16


@dataclass
class PerplexityParams(TextWindowParams):
    """Parameters of the perplexity benchmark, and TextWindowParams' text, offset and
    calibration."""

    context: int = param(1024, range=at_least(1), meaning="prompt tokens prefilled into the cache")
    continuation: int = param(256, range=at_least(2), meaning="tokens scored through the cache"
                              " (at least 2: one decode step)")
    decode_chunk: int = param(1, range=at_least(1), meaning="tokens per decode step; 1 is true"
                              " token-by-token decode")


@register_benchmark("perplexity")
class Perplexity(TextModelBenchmark):
    """Perplexity of a continuation read through the method's cache, against the plain model."""
    report = REPORT  # its part of the report (kvbench.benchmarks.reports)

    Params = PerplexityParams
    needs = {"decode_chunk": ("decode_chunk", 1)}
    metrics = {
        "perplexity": MetricSpec("ppl", "lower", "exp(mean NLL) of the continuation via the cache"),
        "ppl_reference": MetricSpec("ppl", "none", "the plain model (DynamicCache), same tokens"),
        "ppl_rel_delta": MetricSpec("", "lower", "(perplexity - ppl_reference) / ppl_reference"),
        "kv_bytes": MetricSpec("bytes", "lower", "accounted K+V bytes kept at the end, all layers"),
        "kv_bytes_measured": MetricSpec("bytes", "lower", "bytes of the tensors the cache holds"),
        "compression_ratio": MetricSpec("x", "higher", "16-bit K+V of all tokens seen / kv_bytes"),
        "retained_kv": MetricSpec("x", "lower", "kv_bytes / the plain cache's K+V bytes of all"
                                  " tokens seen, at the model's dtype"),
        "prefill_s": MetricSpec("s", "lower", "prefill forward plus end_prefill, per repeat",
                                timing="absolute"),
        "decode_tok_s": MetricSpec("tok/s", "higher", "decoded tokens per second, per"
                                   f" {DECODE_SEGMENT} decode steps", timing="absolute"),
        "prefill_s_vs_plain": MetricSpec(
            "x", "lower", "prefill_s / the plain cache's prefill, run just before it",
            timing="ratio"),
        "decode_tok_s_vs_plain": MetricSpec(
            "x", "higher", f"decode tok/s / the plain cache's over the same {DECODE_SEGMENT}"
                           " steps, run in lockstep", timing="ratio"),
        # Only for methods with sparse-V (their caches count what they skipped):
        "values_skipped": MetricSpec("", "none", "fraction of value rows skipped at decode"),
        "sparse_v_output_error": MetricSpec(
            "", "lower", "mean relative squared error of decode attention outputs vs dense"),
    }

    def tokens_read(self, params: PerplexityParams) -> tuple[str, int, tuple[str, ...]]:
        return (f"context + continuation = {params.context} + {params.continuation}",
                params.context + params.continuation, ("context", "continuation"))
