"""`perplexity`: the continuation is scored through the method's cache, never around it
(the protocol: kvbench.benchmarks.measure.perplexity), over one window of the text or several
drawn with the case's seed (window_offsets); or, with `server`, through a server's cache on the
same windows: `kvbench serve` with the method, or another engine's behind an OpenAI-compatible
server."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvbench.benchmarks.specs.server_target import (
    ServerTarget, missing_server_library, parse_server,
)
from kvbench.config.extras import lacks
from kvbench.config.fields import LibraryMissing, SettingError, at_least, param
from kvbench.benchmarks.records.perplexity import PerplexityRecord
from kvbench.benchmarks.reports.perplexity import REPORT
from kvbench.benchmarks.specs.prefill import prefill_chunk_param
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
    prefill_chunk: int = prefill_chunk_param()
    windows: int = param(1, range=at_least(1),
                         rule="they and calibration fit in the text after offset (checked as"
                         " the case starts)",
                         meaning="windows of context + continuation tokens scored: 1 is the one"
                         " at offset; more are drawn with the case's seed from the text after"
                         " offset, apart, with calibration tokens left after the last")
    time_against_plain: bool = param(False, meaning="also decode the plain cache in lockstep"
                                     " with the method's, for prefill_s_vs_plain and"
                                     " decode_tok_s_vs_plain (twice the model work)")
    server: str | dict[str, Any] | None = param(
        None, rule="none, kvbench, or a mapping as stress's server; decode_chunk 1 and"
        " time_against_plain false with any of them",
        meaning="none: the method measured in process, as above. kvbench: kvbench starts"
        " `kvbench serve` with the case's model and method (one server per method setting and"
        " context, pooled as stress's, its log beside the results, prefilling the context in one"
        " forward) and each window is one /v1/completions request with the prompt as token ids,"
        " echo, logprobs 1, max_tokens 1 and prefill_tokens = context: the in-process protocol"
        " (the context prefilled and compressed, the continuation scored one token at a time"
        " through the cache), so the figures match the in-process ones: identity's to float"
        " rounding; a quantized cache's less closely, as the server's decode step is batched"
        " (step_rows), whose last bits differ and can tip a 4-bit rounding (measured: intq4 on"
        " the bundled model, 32-token continuations, up to 3% in perplexity, 0.03 nats a token,"
        " either way), and a method that calibrates or draws random numbers does so in the"
        " server (on its own calibration text and seed). {command: [...], url: ...} (a server"
        " kvbench starts, as stress does: {port}, {python} and {gguf:NAME} filled, one"
        " server per command in the run, its log beside the results) or {url: ...} (one someone"
        " else runs): the same windows (the same token ids, at the same offsets) are scored through"
        " that server instead, the method unused: each window is one such request without"
        " prefill_tokens, and each continuation token is scored by its echoed logprob. The"
        " protocol differs: the server evaluates the whole window as a prompt (llama.cpp in"
        " batches of n_batch tokens, each batch's K and V written to its cache, quantized with"
        " --type_k/--type_v, before attention reads them back), where kvbench prefills the"
        " context in one forward and then scores the continuation one token at a time through"
        " the cache. ppl_reference stays kvbench's plain model on the same tokens; no bytes or"
        " timings are reported. llama-cpp-python's own server takes no token ids and misaligns"
        " echoed logprobs: start it as `python -m kvbench.serve.llama_cpp`. Loopback hosts only")

    def check(self) -> None:
        super().check()
        if self.server is None:
            return
        try:
            target = parse_server(self.server)  # loopback unless it says remote
        except ValueError as exc:
            raise SettingError("server", str(exc)) from None
        if self.decode_chunk != 1:
            raise SettingError("decode_chunk", "decode_chunk: a server scores the whole window"
                               " in one request; decode_chunk applies in process only (leave"
                               " it 1 with server)")
        if self.time_against_plain:
            raise SettingError("time_against_plain", "time_against_plain: nothing is timed"
                               " through a server; leave it false with server")
        missing = lacks("serve", "perplexity through a server") or missing_server_library(target)
        if missing:  # its cases are refused, the suite's others run
            raise LibraryMissing("server", missing)

    @property
    def target(self) -> ServerTarget | None:
        """The server that scores the windows; None: the method, in process."""
        return None if self.server is None else parse_server(self.server)


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
    measured_in = "kvbench.benchmarks.measure.perplexity"
    report = REPORT
    record = PerplexityRecord

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

    def workload(self, params: PerplexityParams) -> float:
        return float(params.windows * (params.context + params.continuation))

    def tokens_read(self, params: PerplexityParams) -> tuple[str, int, tuple[str, ...]]:
        return (f"context + continuation = {params.context} + {params.continuation}",
                params.context + params.continuation, ("context", "continuation"))
