"""Attention Matching compaction (`am`, Zweiger et al. 2026) and its task-guided variant
(`am_task`, Latent Briefing): at end_prefill each layer's prompt is replaced by t keys per KV head,
a fitted bias beta on their logits, and fitted values, so that softmax(Q C_k^T + beta) C_v matches
softmax(Q K^T) V on reference queries."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import at_least, param
from kvbench.methods.settings.base import Capabilities, register_method
from kvbench.methods.settings.tokens import TokenMethod

RIDGE = "the ridge of the value fit; 0 is plain least squares"


@register_method("am")
@dataclass
class AM(TokenMethod):
    """Attention Matching with the model's own queries over the prompt as reference queries
    (the default of the paper's code), per-head top-t by `score` (rms, max, mean), beta by
    bounded least squares refined by projected gradient (seeded power iteration), values by
    ridge regression (`ridge` = 0: the paper's least squares; seed 000's engine uses ridge > 0).
    `fit_beta: false` / `fit_values: false` turn the fits off (both off: plain top-t selection by
    the same score), so what beta and C_v buy is measured.

    `queries: repeat` takes the reference queries from the prompt fed a second time after itself
    (repeat-prefill, the paper's alternative): they see every key as later queries do.

    `causal: true` is the cleaner variant: each prompt query scores and fits only against keys up
    to its own position. The spec's default lets every prompt query see every key, pairing early
    queries with later keys at negative RoPE distances the model never produces; on the bundled
    model that fits beta to queries unlike the decode queries that meet it (kvbench's eviction
    suite measures both).

    Defaults: score rms, B in [e^-3, e^3], ridge 0 as the paper's AM-HighestAttnKeys config
    (evaluation/configs/algorithms/default.py, seen in the fork bkal01/compaction, which also sets
    nnls_iters=2 and on_policy=True); here 20 projected-gradient steps from a seeded power
    iteration and no on-policy pass; upstream scales a nonzero ridge by ||X||_2^2.

    A prompt longer than `segment` keys is fitted segment by segment, as the paper's code
    compacts long contexts in chunks of 4096 tokens (kvbench.methods.torch.am_fit.fit_in_segments;
    the selection stays global): the fits' systems stay segment x segment, where the whole
    prompt's would grow with the square of the kept keys (8192 per head at 32k and ratio 0.25).
    The reference queries are at most `max_queries` per KV head (the query heads of a group
    each count), those of every s-th token of a longer prompt, as the paper's code caps them
    (max_query_vectors_per_kv_head): held as the prompt comes, they are a share of the cache,
    not four times the keys."""

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.am",
        "mlx": "kvbench.methods.mlx.token_policies",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"ratio": 0.5}, {"ratio": 0.5, "queries": "repeat"},
        {"budget": 12, "causal": True, "score": "max", "fit_values": False})

    score: Literal["rms", "max", "mean"] = param(
        "rms", meaning="how a key's attention from the reference queries is reduced to its"
        " score: rms sqrt(mean A^2), max or mean")
    fit_beta: bool = param(True, meaning="fit beta, the bias added to each kept key's logit")
    fit_values: bool = param(True, meaning="fit the kept values by ridge regression (False"
                             " keeps them)")
    ridge: float = param(0.0, range=at_least(0), meaning=RIDGE)
    seed: int = param(0, meaning="seed of the power iteration that starts the beta fit")
    causal: bool = param(False, meaning="each prompt query scores and fits only against the keys"
                         " up to its own position")
    segment: int = param(4096, range=at_least(0), meaning="keys per segment of the fits: a"
                         " longer prompt is fitted segment by segment (0: whole)")
    max_queries: int = param(8192, range=at_least(0), meaning="reference queries per KV head"
                             " at most: a longer prompt's are those of evenly spaced tokens,"
                             " taken as they come (0: all)")
    queries: Literal["context", "repeat"] = param(
        "context", meaning="where the reference queries come from: context, the prompt's own;"
        " repeat, the prompt fed again after itself")

    def supports(self) -> Capabilities:
        # a probe's queries are the reference queries only with `queries: repeat`
        return Capabilities(trim=True, probes=self.queries == "repeat")

    def reference_probe(self, prompt: list[int]) -> list[int]:
        return list(prompt) if self.queries == "repeat" else []

    def layout(self) -> str:
        fitted = [name for name, on in (("beta (one bias per kept key)", self.fit_beta),
                                        ("fitted values", self.fit_values)) if on]
        extra = f" with {' and '.join(fitted)}" if fitted else ""
        return (f"{self.name}: keeps {self.describe()} per KV head{extra}, at the model's dtype;"
                " K and V both counted")


@register_method("am_task")
@dataclass
class AMTask(AM):
    """Task-guided Attention Matching (Latent Briefing's modification, seed 000's engine): the
    reference queries are a task prompt's (a probe fed and taken back before end_prefill; without
    one, the prompt's last `task_tokens` queries), scores are averaged over heads so one token mask
    is shared by every head of a layer, and tokens scoring above median + tau * MAD are kept. With
    `ratio` or `budget` set instead, the shared mask keeps that many top tokens.

    Values are fitted by ridge regression, as the engine does; its lambda is not published, so
    the default `ridge` 1e-3 is measured here: a few task queries leave the plain least squares
    ill-posed (bundled model, 1024-token prompt, ratio 0.25: ppl_rel_delta 5.34 at ridge 0, -0.06
    at 1e-3, -0.06 at 1e-2, 0.10 at 1e-1).

    Defaults: tau 1.0, task_tokens 32 and ridge 1e-3 are kvbench's; no upstream code for seed
    000's engine or Latent Briefing was found."""

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"ratio": 0.5}, {"tau": 0.5}, {"budget": 12, "task_tokens": 8})

    tau: float = param(1.0, meaning="tokens whose head-averaged score is above median +"
                       " tau * MAD are kept (with neither ratio nor budget set)")
    task_tokens: int = param(32, range=at_least(1), meaning="without a probe, the prompt's last"
                             " this many queries are the task's")
    ridge: float = param(1e-3, range=at_least(0), meaning=RIDGE + " (see below)")

    def check_budget(self) -> None:
        if self.ratio is not None or self.budget is not None:  # else: the MAD threshold
            super().check_budget()

    def supports(self) -> Capabilities:
        # the MAD threshold keeps a different count per layer, and a multi-token step's one
        # causal mask must fit every layer
        fixed = self.ratio is not None or self.budget is not None
        return Capabilities(decode_chunk=fixed, trim=True, probes=True)

    def describe(self) -> str:
        if self.ratio is None and self.budget is None:
            return f"the tokens scoring above median + {self.tau:g} * MAD, shared by all heads,"
        return f"{super().describe()}, shared by all heads,"
