"""`ladder`'s declaration: what a method really saves as the context grows, one rung (context
length) per case; the protocol is kvbench.benchmarks.measure.ladder's. Ratios against the plain
cache come from claims such as `peak_bytes / identity <= 0.51` (the same rung's identity case in
the same run)."""
from __future__ import annotations

from dataclasses import dataclass

from kvbench.config.fields import at_least, param
from kvbench.benchmarks.records.ladder import LadderRecord
from kvbench.benchmarks.reports.ladder import REPORT
from kvbench.benchmarks.specs.base import (
    MetricSpec, TextModelBenchmark, TextWindowParams, register_benchmark,
)


@dataclass
class LadderParams(TextWindowParams):
    """Parameters of the ladder benchmark (one rung; a matrix over `length` makes the ladder),
    and TextWindowParams' text, offset and calibration: a text shorter than offset + length is
    repeated (info.text_repeats says how often); calibration tokens come after the prompt and
    are handed over before the peak is reset."""

    length: int = param(4096, range=at_least(2), meaning="prompt tokens. Lengths past the"
                        " model's trained context are run (time and memory only)")
    prefill_chunk: int = param(1024, range=at_least(1), meaning="prompt tokens per forward;"
                               " bounds the attention's temporaries")
    decode: int = param(16, range=at_least(1), meaning="tokens generated greedily after the"
                        " prompt")


@register_benchmark("ladder")
class Ladder(TextModelBenchmark):
    """Time, true peak memory and KV bytes of one context length (a rung): chunked prefill,
    then greedy decode, through the method's cache. Compare rungs across methods with claims
    like `peak_bytes / identity <= 0.51`."""
    measured_in = "kvbench.benchmarks.measure.ladder"
    report = REPORT
    record = LadderRecord

    Params = LadderParams
    # a prompt fed in several forwards
    needs = {"prefill_chunk": ("chunked_prefill", lambda p: p.prefill_chunk >= p.length)}
    metrics = {
        "prefill_s": MetricSpec("s", "lower", "prompt forwards plus end_prefill",
                                timing="absolute"),
        "decode_tok_s": MetricSpec("tok/s", "higher", "greedy decode tokens per second",
                                   timing="absolute"),
        "e2e_s": MetricSpec("s", "lower", "prefill_s plus the decode's seconds",
                            timing="absolute"),
        "peak_bytes": MetricSpec(
            "bytes", "lower", "high-water mark during the case: process resident memory on CPU"
            " (model included), the allocator's on CUDA and MLX"),
        "peak_over_loaded_bytes": MetricSpec(
            "bytes", "lower", "peak_bytes minus loaded_bytes: what the case itself added"),
        "loaded_bytes": MetricSpec(
            "bytes", "none", "memory held when the case started (the model, the runtime)"),
        "weights_bytes": MetricSpec("bytes", "none", "the model's parameters and buffers"),
        "retained_kv_bytes": MetricSpec(
            "bytes", "lower", "what the method's layout stores after the decode (accounted)"),
        "kv_bytes_measured": MetricSpec(
            "bytes", "lower", "bytes of the arrays the cache holds after the decode"),
        "kv_high_water_bytes": MetricSpec(
            "bytes", "lower", "the most the cache's arrays held after any forward"),
        "retained_kv": MetricSpec(
            "", "lower", "retained_kv_bytes / the plain cache's bytes for the tokens seen"),
    }
