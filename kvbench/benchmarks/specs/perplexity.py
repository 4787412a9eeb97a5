"""`perplexity`: the continuation is scored through the method's cache, never around it
(the protocol: kvbench.benchmarks.measure.perplexity), over one window of the text or several
drawn with the case's seed (window_offsets)."""
from __future__ import annotations

import random
from dataclasses import dataclass

from kvbench.config.fields import SettingError, at_least, param
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
    windows: int = param(1, range=at_least(1),
                         rule="they and calibration fit in the text after offset (checked as"
                         " the case starts)",
                         meaning="windows of context + continuation tokens scored: 1 is the one"
                         " at offset; more are drawn with the case's seed from the text after"
                         " offset, apart, with calibration tokens left after the last")
    time_against_plain: bool = param(False, meaning="also decode the plain cache in lockstep"
                                     " with the method's, for prefill_s_vs_plain and"
                                     " decode_tok_s_vs_plain (twice the model work)")


def window_offsets(params: PerplexityParams, text_tokens: int, seed: int) -> list[int]:
    """Where each window starts in the tokenised text (`text_tokens` long), in order. One window
    starts at params.offset (a text too short for it is refused where it is read). More are
    drawn with `seed`: the same offsets for every method of a run, so their windows pair up;
    they do not overlap, and `calibration` tokens are left after the last one. SettingError
    naming `windows` when they do not fit."""
    if params.windows == 1:
        return [params.offset]
    need = params.context + params.continuation
    room = text_tokens - params.offset - params.calibration
    if params.windows * need > room:
        raise SettingError("windows", f"windows: {params.windows} windows of context +"
                           f" continuation = {need} tokens need {params.windows * need}; text"
                           f" {params.text!r} has {text_tokens} tokens, {max(room, 0)} after"
                           f" offset {params.offset} once {params.calibration} are left for"
                           f" calibration: room for {max(room, 0) // need} windows")
    # The gaps before each window, sorted: windows in text order, never overlapping.
    rng = random.Random(seed)
    gaps = sorted(rng.randrange(room - params.windows * need + 1) for _ in range(params.windows))
    return [params.offset + gap + i * need for i, gap in enumerate(gaps)]


@register_benchmark("perplexity")
class Perplexity(TextModelBenchmark):
    """Perplexity of a continuation read through the method's cache, against the plain model."""
    report = REPORT  # its part of the report (kvbench.benchmarks.reports)

    Params = PerplexityParams
    needs = {"decode_chunk": ("decode_chunk", 1)}
    metrics = {
        "perplexity": MetricSpec("ppl", "lower", "exp(total NLL / scored tokens) of the"
                                 " continuations via the cache, all windows pooled"),
        "ppl_reference": MetricSpec("ppl", "none", "the plain model (DynamicCache), same tokens"),
        "ppl_rel_delta": MetricSpec("", "lower", "(perplexity - ppl_reference) / ppl_reference"),
        # Only with windows >= 2: a percentile bootstrap over the windows, seeded.
        "ppl_rel_delta_ci_low": MetricSpec("", "none", "95% interval of ppl_rel_delta over the"
                                           " windows, low end"),
        "ppl_rel_delta_ci_high": MetricSpec("", "none", "95% interval of ppl_rel_delta over the"
                                            " windows, high end"),
        "kv_bytes": MetricSpec("bytes", "lower", "accounted K+V bytes kept at the end, all layers"),
        "kv_bytes_measured": MetricSpec("bytes", "lower", "bytes of the tensors the cache holds"),
        "compression_ratio": MetricSpec("x", "higher", "16-bit K+V of all tokens seen / kv_bytes"),
        "retained_kv": MetricSpec("x", "lower", "kv_bytes / the plain cache's K+V bytes of all"
                                  " tokens seen, at the model's dtype"),
        "prefill_s": MetricSpec("s", "lower", "prefill forward plus end_prefill, per repeat",
                                timing="absolute"),
        "decode_tok_s": MetricSpec("tok/s", "higher", "decoded tokens per second, per"
                                   f" {DECODE_SEGMENT} decode steps", timing="absolute"),
        # Only with time_against_plain:
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
