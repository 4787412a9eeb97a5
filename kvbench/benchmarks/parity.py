"""`parity`: does incremental decode through the method's cache give what a full recompute of the
same sequence gives?

Prefill `context` tokens (any length) through the cache, feed the method's reference probe and take
it back (kvbench.models.session.prefill, as every benchmark does), end_prefill, then decode `steps`
tokens greedily, one at a time through the cache. Then run the plain model once over the whole
sequence (no cache) and compare its logits at the same positions. A lossless method must match to
float tolerance and pick the same tokens (this is where wrong RoPE positions, masks or cache
order show); a lossy one reports how far each step diverges.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.benchmarks.base import (
    BenchmarkOutput,
    MetricSpec,
    RunContext,
    TextModelBenchmark,
    TextWindowParams,
    check_at_least,
    register_benchmark,
)
from kvbench.benchmarks.divergence import kl_divergence
from kvbench.data.text import tokens_sha256
from kvbench.methods.base import Method
from kvbench.models.info import ModelInfo
from kvbench.models.session import open_session, prefill


@dataclass
class ParityParams(TextWindowParams):
    """Parameters of the parity benchmark, and TextWindowParams' text, offset and calibration.

    context: int = 100 — prompt tokens prefilled before decoding (any length >= 1).
    steps: int = 16 — tokens decoded one at a time through the cache (>= 1).
    trim: int = 0 — after the prefill, rewind the cache by this many tokens and feed them again
        (0 <= trim < context): the re-fed tokens must get their positions back. Methods that
        cannot take tokens back (compressed ones) refuse a trim.
    """

    context: int = 100
    steps: int = 16
    trim: int = 0

    def __post_init__(self):
        check_at_least(self, {"context": 1, "steps": 1, "trim": 0})
        if self.trim >= self.context:
            raise ValueError(f"trim must be below context ({self.context}), got {self.trim!r}")
        super().__post_init__()


@register_benchmark("parity")
class Parity(TextModelBenchmark):
    """Incremental decode through the cache against a full recompute of the same sequence."""

    Params = ParityParams
    needs = {"trim": ("trim", 0)}
    metrics = {
        "max_logit_diff": MetricSpec(
            "logit", "lower", "max |logit_cached - logit_full|, all steps"),
        "mean_kl": MetricSpec("nats", "lower", "mean over steps of KL(full || cached)"),
        "max_kl": MetricSpec("nats", "lower", "largest KL(full || cached) of any step"),
        "greedy_agreement": MetricSpec(
            "", "higher", "fraction of steps where the full recompute picks the cached token"),
        "first_divergence": MetricSpec(
            "steps", "higher", "steps before the full recompute first picks another token"),
    }

    def check(self, params: ParityParams, model: ModelInfo | None) -> None:
        self.check_text_and_model(params.text, model)
        self.check_length(model, "context + steps", params.context + params.steps)

    def run(self, params: ParityParams, method: Method, ctx: RunContext) -> BenchmarkOutput:
        session = open_session(ctx)
        prompt, calibration = self.read_window(ctx, session, params, params.context)
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
        kl = kl_divergence(full, cached)
        agree = [int(row.argmax()) == token for row, token in zip(full, tokens)]
        first = agree.index(False) if False in agree else len(agree)
        m = self.metrics
        return BenchmarkOutput(
            metrics={
                "max_logit_diff": m["max_logit_diff"].of(float((cached - full).abs().max())),
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
