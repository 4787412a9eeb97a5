"""`parity`: does incremental decode through the method's cache give what a full recompute of the
same sequence gives?

Prefill `context` tokens (any length) through the cache, feed the method's reference probe and take
it back (kvbench.models.session.prefill, as every benchmark does), end_prefill, then decode `steps`
tokens greedily, one at a time through the cache. Then run the plain model once over the whole
sequence (no cache) and compare its logits at the same positions. A lossless method must match to
float tolerance and pick the same tokens (this is where wrong RoPE positions, masks or cache
order show); a lossy one reports how far each step diverges. The same steps are also compared
with one forward through the model's own attention (transformers' eager, mlx-lm's own), so a
feature kvbench's attention missed (a window, sinks, softcap) shows even for identity, and with
the model's own decode of the same tokens (its own attention and cache): where a model's full
forward and its decode differ by themselves (Zamba 2's Mamba mixer), that is the reference.
"""
from __future__ import annotations


import torch

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.parity import Parity, ParityParams
from kvbench.benchmarks.measure.divergence import kl_divergence
from kvbench.data.text import tokens_sha256
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import prefill


@measures(Parity)
class ParityRun(Parity):
    def run(self, params: ParityParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session, prompt, calibration = ctx.open_window(params, params.context)
        session.calibrate(method, calibration)
        torch.manual_seed(ctx.seed)

        ctx.status("cached decode")
        cache = session.new_cache(method)
        logits = prefill(session, cache, prompt, method, refeed=params.trim)[0]
        rows, tokens = [logits[-1]], [int(logits[-1].argmax())]
        while len(tokens) < params.steps:
            logits, _ = session.step(tokens[-1:], cache)
            rows.append(logits[-1])
            tokens.append(int(logits[-1].argmax()))
        cached = torch.stack(rows).double()

        ctx.status("full recompute")
        full = session.full_logits(prompt + tokens[:-1], last=params.steps).double()
        own = session.own_attention_logits(prompt + tokens[:-1], last=params.steps).double()
        own_decode = session.own_decode_logits(prompt, tokens[:-1]).double()
        kl = kl_divergence(full, cached)
        agree = [int(row.argmax()) == token for row, token in zip(full, tokens)]
        first = agree.index(False) if False in agree else len(agree)
        m = self.metrics
        return BenchmarkOutput(
            metrics={
                "max_logit_diff": m["max_logit_diff"].of(float((cached - full).abs().max())),
                "own_attention_max_logit_diff": m["own_attention_max_logit_diff"].of(
                    float((cached - own).abs().max())),
                "own_decode_max_logit_diff": m["own_decode_max_logit_diff"].of(
                    float((cached - own_decode).abs().max())),
                "layers_compressed": m["layers_compressed"].of(len(cache.hosts)),
                "mean_kl": m["mean_kl"].of(float(kl.mean())),
                "max_kl": m["max_kl"].of(float(kl.max())),
                "greedy_agreement": m["greedy_agreement"].of(sum(agree) / len(agree)),
                "first_divergence": m["first_divergence"].of(first),
            },
            info={
                "layout": method.layout(),
                "kl_per_step": [round(float(x), 6) for x in kl],
                "tokens": tokens,
            },
            comparable={"tokens_sha256": tokens_sha256(prompt), "model": session.spec,
                        "model_dtype": session.dtype},
        )
