"""`ladder`: what a method really saves as the context grows, one rung (context length) per case.

Protocol: the prompt (`length` tokens of a text) is fed through the method's cache in forwards of
`prefill_chunk` tokens, keeping only the last position's logits; then end_prefill (compaction
happens here), then `decode` tokens generated greedily through the same cache. The peak-memory
probe is reset just before the cache is made, after the model is loaded and freed memory handed
back, so `peak_bytes` is the high-water mark of this case alone: on CPU the process's resident
high-water mark (Linux resets it per case), on CUDA the allocator's, on MLX MLX's. The cache's own
size is measured after every forward (`kv_high_water_bytes`), which tells a compression that is
physical (the cache never grows large) from one that is only logical (the cache holds every
token until end_prefill, so the peak does not fall with the bytes retained after it). A policy
that reduces after a forward's attention (snapkv, h2o evicting every chunk) holds one more chunk
in one layer at a time during the forward, which this measure does not see; peak_bytes does.
Ratios against the plain cache come from claims such as `peak_bytes / identity <= 0.51`
(the same rung's identity case in the same run). Past the model's trained context the ladder
measures only time and memory: there are no quality metrics here.
"""
from __future__ import annotations


import torch

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.ladder import Ladder, LadderParams
from kvbench.data.text import text_tokens, tokens_sha256
from kvbench.memo import Memo
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, plain_kv_bytes, prefill
from kvbench.models.warm_up import warm_up

# Warm-up prompt at most: long enough for a 10% budget to hold attention sinks and a window.
WARM_UP_TOKENS = 1024


def ladder_tokens(memo: Memo, session: Session, params: LadderParams
                  ) -> tuple[list[int], list[int], int]:
    """(the prompt's `length` tokens, calibration tokens, how many times the text was read):
    the text from its offset, repeated from its start when it runs out."""
    tokens = text_tokens(memo, session, params.text)
    if params.offset >= len(tokens):
        raise ValueError(f"text {params.text!r} has {len(tokens)} tokens; offset {params.offset}"
                         " is past its end")
    need = params.length + params.calibration
    stream, repeats = list(tokens[params.offset:]), 1
    while len(stream) < need:
        stream += tokens
        repeats += 1
    return stream[: params.length], stream[params.length : need], repeats


@measures(Ladder)
class LadderRun(Ladder):
    def run(self, params: LadderParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session = ctx.open_session()
        prompt, calibration, repeats = ladder_tokens(ctx.memo, session, params)
        ctx.status("calibrate")
        session.calibrate(method, calibration)
        # One prefill chunk of the prompt first (the run's warm-up was filler text): a
        # calibrated method's kernels and the chunk's shapes are set up before the clock starts.
        warm_up(session, method, prompt[:min(params.prefill_chunk or WARM_UP_TOKENS,
                                             WARM_UP_TOKENS)])
        loaded = session.reset_peak_memory()
        cache = session.new_cache(method)
        session.reserve(cache, params.length + params.decode)
        kv_high = 0

        def after_forward(fed: int) -> None:
            nonlocal kv_high
            kv_high = max(kv_high, cache.measured_bytes())
            ctx.status(f"prefill {fed}/{params.length}")

        logits, forward_s, compact_s = prefill(session, cache, prompt, method,
                                               chunk=params.prefill_chunk,
                                               after_chunk=after_forward)
        kv_high = max(kv_high, cache.measured_bytes())  # after end_prefill
        decode_s, generated = 0.0, []
        for i in range(params.decode):
            ctx.status(f"decode {i + 1}/{params.decode}")
            token = int(logits[-1].argmax())
            generated.append(token)
            logits, seconds = session.step([token], cache, last_only=True)
            decode_s += seconds
            kv_high = max(kv_high, cache.measured_bytes())
        peak, peak_what = session.peak_memory()

        seen = params.length + params.decode
        plain_bytes = plain_kv_bytes(session, cache)[1]
        retained = cache.accounted_bytes()
        prefill_s = forward_s + compact_s
        trained = session.loaded.max_context
        m = self.metrics
        return BenchmarkOutput(
            metrics={
                "prefill_s": m["prefill_s"].of(prefill_s),
                "decode_tok_s": m["decode_tok_s"].of(params.decode / decode_s),
                "e2e_s": m["e2e_s"].of(prefill_s + decode_s),
                "peak_bytes": m["peak_bytes"].of(peak),
                "peak_over_loaded_bytes": m["peak_over_loaded_bytes"].of(peak - loaded),
                "loaded_bytes": m["loaded_bytes"].of(loaded),
                "weights_bytes": m["weights_bytes"].of(session.weights_bytes()),
                "retained_kv_bytes": m["retained_kv_bytes"].of(retained),
                "kv_bytes_measured": m["kv_bytes_measured"].of(cache.measured_bytes()),
                "kv_high_water_bytes": m["kv_high_water_bytes"].of(kv_high),
                "retained_kv": m["retained_kv"].of(retained / plain_bytes),
            },
            info={
                "layout": method.layout(),
                "peak_memory": peak_what,
                "plain_kv_bytes": plain_bytes,
                "end_prefill_s": compact_s,
                "generated": generated,
                "text": params.text,
                "text_repeats": repeats,
                "beyond_trained_context": trained is not None and seen > trained,
                "torch_threads": torch.get_num_threads(),
            },
            comparable={"tokens_sha256": tokens_sha256(prompt), "model": session.spec,
                        "model_dtype": session.dtype},
        )
