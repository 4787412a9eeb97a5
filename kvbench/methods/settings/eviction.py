"""Eviction references: `streamingllm`, `snapkv`, `h2o`. Each keeps full-precision tokens and
drops the rest; by default all reduce the prompt at end_prefill (the prompt's forward itself is
exact), or with `evict: every_chunk` while it is fed; the fixed-size ones (streamingllm, h2o)
keep their budget through decode."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import SettingError, at_least, between, param
from kvbench.methods.settings.base import Capabilities, register_method
from kvbench.methods.settings.tokens import TokenMethod


@dataclass
class EvictionMethod(TokenMethod):
    """A token method that can also hold its budget while the prompt is fed (`evict`)."""

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.eviction",
        "mlx": "kvbench.methods.mlx.token_policies",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        *TokenMethod.conformance_params, {"budget": 9, "evict": "every_chunk"})

    evict: Literal["end_prefill", "every_chunk"] = param(
        "end_prefill", meaning="when the prompt is reduced: once it is in, or at every forward"
        " while it is fed (the cache then holds at most the budget and one chunk)")

    def evicts_every_chunk(self) -> bool:
        return self.evict == "every_chunk"

    def supports(self) -> Capabilities:
        if self.evicts_every_chunk():  # tokens go while the prompt is fed: none can be taken back
            return dataclasses.replace(self.capabilities, trim=False, probes=False)
        return self.capabilities

    def describe(self) -> str:
        when = ", evicting every chunk" if self.evicts_every_chunk() else ""
        return super().describe() + when


@register_method("streamingllm")
@dataclass
class StreamingLLM(EvictionMethod):
    """StreamingLLM (Xiao et al.): the first `sinks` tokens plus the newest ones, `ratio` of the
    prompt or `budget` tokens in all, held at that size through decode.

    Defaults: sinks 4 as mit-han-lab/streaming-llm streaming_llm/kv_cache.py (start_size=4) and
    kvpress's StreamingLLMPress (n_sink=4). Upstream shifts positions inside the cache; here keys
    keep their original RoPE positions (kvpress without KeyRerotationPress).

    `evict`: "end_prefill" reduces the whole prompt once it is in (kvpress's press: the prompt's
    forward is exact); "every_chunk" makes room before every forward, prefill chunks included,
    as upstream's evict_for_space runs before each step: the cache never holds more than the
    budget and one chunk, so memory follows the budget while prefilling. The kept positions
    are the same either way (the sinks and the newest tokens); their keys and values differ,
    since later chunks attend over what is kept. A ratio budget needs the prompt's length
    before it is fed, which kvbench's benchmarks and server give (session.prefill).
    """

    scores_by_keys: ClassVar[bool] = False  # its positions alone

    sinks: int = param(4, range=at_least(0), meaning="the first tokens always kept (attention"
                       " sinks), within the budget")

    def check(self) -> None:
        super().check()
        if self.budget is not None and self.budget <= self.sinks:
            raise SettingError("budget", f"a budget of {self.budget} tokens leaves no window"
                               f" after {self.sinks} sink tokens")


@register_method("snapkv")
@dataclass
class SnapKV(EvictionMethod):
    """SnapKV (Li et al.): the prompt's last `window` queries vote with their attention (summed
    over the window and the query heads that share a KV head), votes are pooled (`pooling`,
    `kernel`), and each head keeps its top tokens plus the window, the budget in all. A probe (a
    question fed and taken back before end_prefill) is the observation window instead, when
    given.

    Defaults: FasterDecoding/SnapKV snapkv/monkeypatch/snapkv_utils.py init_snapkv (window_size
    32, kernel_size 5, pooling avgpool); its SnapKVCluster and kvpress's SnapKVPress use window
    64. Upstream selects per query head (repeat_kv first); here per KV head, votes summed over
    its query heads (kvpress averages them: the same choice).

    `evict: every_chunk` reduces the cache to the budget after every forward of the prompt, by
    that chunk's last `window` queries, the cache carried from chunk to chunk: FINCH's scheme
    (Corallo & Papotti, TACL 2024, arXiv 2408.00167: the text fed in chunks, the most relevant
    keys and values of each kept beside those already kept). FINCH's votes come from the
    question fed after each chunk; here from the chunk's own last queries, since the question
    is not known before the prompt ends. No probe then: tokens go before it could be read.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(trim=True, probes=True)
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"ratio": 0.5, "window": 8}, {"budget": 40, "pooling": "max", "kernel": 7},
        {"budget": 20, "window": 8, "evict": "every_chunk"})

    window: int = param(32, range=at_least(1), meaning="the prompt's last queries that vote,"
                        " whose tokens are kept too")
    kernel: int = param(5, range=at_least(1), rule="odd",
                        meaning="width of the pooling over neighbouring tokens' votes")
    pooling: Literal["avg", "max"] = param("avg", meaning="avg or max pooling of the votes")

    def check(self) -> None:
        if self.kernel % 2 == 0:
            raise SettingError("kernel", f"kernel must be an odd number >= 1, got {self.kernel}")
        super().check()


@register_method("h2o")
@dataclass
class H2O(EvictionMethod):
    """H2O (Zhang et al.): heavy hitters by the attention each key has accumulated from every
    query so far, plus the newest `recent` fraction of the budget; held at the budget through
    decode. The accumulated scores (float32 per held key and head) are bookkeeping, counted in
    measured bytes, not in the layout.

    Defaults: recent 0.5 as FMInference/H2O h2o_hf/run_text_generation.py and
    scripts/lm_eval/h2o.sh (heavy_ratio 0.1, recent_ratio 0.1: half of a 0.2 budget is recent).

    `evict: every_chunk` evicts after every forward of the prompt as after a decode step: the
    paper's greedy policy (Algorithm 1) runs step by step, each step's queries adding to the
    scores of the keys they see, and a chunk is a step of many tokens. The default reduces the
    prompt once it is in, as the upstream code scores the whole prompt's attention.
    """

    recent: float = param(0.5, range=between(0, 1, low_open=True, high_open=True),
                          meaning="the fraction of the budget given to the newest tokens; the"
                          " rest goes to the heavy hitters")
