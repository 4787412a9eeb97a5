"""`quality`: how far the method's cache moves the model's next-token distributions and its greedy
text, against the uncompressed model on the same tokens and backend.

Teacher-forced part: prefill `context` tokens through the cache, end_prefill, then feed the
`continuation` tokens one at a time; at every position compare the next-token distribution with
the plain cache's on the same tokens: top-k overlap, KL both ways over the full vocabulary, top-1
agreement. Greedy part: from a fresh prefill of the same context, generate `greedy_tokens` tokens
with each cache and compare them.
"""
from __future__ import annotations


import torch

from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.quality import Quality, QualityParams
from kvbench.benchmarks.measure.divergence import kl_divergence
from kvbench.data.text import tokens_sha256
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, prefill


@measures(Quality)
class QualityRun(Quality):
    def run(self, params: QualityParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session, window, calibration = ctx.open_window(params, params.context + params.continuation)
        sha = tokens_sha256(window)

        def reference() -> tuple[torch.Tensor, list[int]]:
            ctx.status("reference")
            return (_forced(session, window, params.context, None),
                    _greedy(session, window[: params.context], params.greedy_tokens, None))

        # Every method of the run compares with the same plain logits and greedy tokens.
        plain, plain_greedy = ctx.memo.get(
            ("quality.reference", *session.memo_key, sha, params.context, params.greedy_tokens),
            reference)

        ctx.status("calibrate")
        session.calibrate(method, calibration)
        torch.manual_seed(ctx.seed)
        ctx.status("teacher-forced")
        logits = _forced(session, window, params.context, method)
        ctx.status("greedy")
        greedy = _greedy(session, window[: params.context], params.greedy_tokens, method)

        k = min(params.top_k, plain.shape[-1])
        top_p, top_q = plain.topk(k, dim=-1).indices, logits.topk(k, dim=-1).indices
        overlap = [len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(top_p, top_q)]
        same = [a == b for a, b in zip(greedy, plain_greedy)]
        prefix = same.index(False) if False in same else len(same)
        m = self.metrics
        return BenchmarkOutput(
            metrics={
                "top_k_overlap": m["top_k_overlap"].of(sum(overlap) / len(overlap)),
                "kl_plain_method": m["kl_plain_method"].of(
                    float(kl_divergence(plain, logits).mean())),
                "kl_method_plain": m["kl_method_plain"].of(
                    float(kl_divergence(logits, plain).mean())),
                "top1_agreement": m["top1_agreement"].of(
                    float((top_p[:, 0] == top_q[:, 0]).double().mean())),
                "greedy_agreement": m["greedy_agreement"].of(sum(same) / len(same)),
                "greedy_prefix": m["greedy_prefix"].of(prefix / len(same)),
            },
            info={
                "layout": method.layout(),
                "positions": plain.shape[0],
                "greedy_text": session.tokenizer.decode(greedy),
                "greedy_text_plain": session.tokenizer.decode(plain_greedy),
            },
            comparable={"tokens_sha256": sha, "model": session.spec,
                        "model_dtype": session.dtype},
        )


def _forced(session: Session, window: list[int], context: int,
            method: Implementation | None) -> torch.Tensor:
    """Next-token logits (len(window) - context, vocab) for positions context-1 .. end-1."""
    cache = session.new_cache(method)
    first = prefill(session, cache, window[:context], method)[0]
    rows = [first]
    for token in window[context:-1]:
        rows.append(session.step([token], cache)[0])
    return torch.cat(rows).double()


def _greedy(session: Session, prompt: list[int], n: int, method: Implementation | None) -> list[int]:
    cache = session.new_cache(method)
    logits = prefill(session, cache, prompt, method)[0]
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n:
        logits, _ = session.step(tokens[-1:], cache)
        tokens.append(int(logits[-1].argmax()))
    return tokens
