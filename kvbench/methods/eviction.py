"""Eviction references: `streamingllm`, `snapkv`, `h2o`. Each keeps full-precision tokens and
drops the rest; all reduce the prompt at end_prefill (the prompt's forward itself is exact), and
the fixed-size ones (streamingllm, h2o) keep their budget through decode by evicting after every
step, one token or many. Budgets are a ratio of the prompt or a fixed number of tokens per head;
budget, protected tokens, top-k and gather live in kvbench.methods.token_cache.ScorerCache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.methods.base import Capabilities, register_method, tensor_bytes
from kvbench.methods.token_cache import ScorerCache, TokenMethod, attention_weights

POOLINGS = ("avg", "max")


class StreamingCache(ScorerCache):
    """The sinks and a window of the newest tokens: no scores needed. As upstream's
    evict_for_space, room is made before each decode step, so a step attends over the budget,
    its own tokens included; a multi-token step gets its own causal mask over what is kept."""

    reads_queries = False
    holds_budget = True

    def __init__(self, method: TokenMethod):
        super().__init__(method)
        self._step = 0  # tokens in the latest append

    def protected(self, size: int) -> tuple[int, int]:
        return self.method.sinks, size - self.method.sinks

    def budget_tokens(self) -> int:
        size = super().budget_tokens()
        if size <= self.method.sinks:
            raise ValueError(f"streamingllm: a budget of {size} tokens leaves no window after"
                             f" {self.method.sinks} sink tokens")
        return size

    def end_prefill(self) -> None:
        super().end_prefill()
        self.observes_queries = False  # room is made before a step, not after it

    def append(self, keys, values, queries=None) -> None:
        self._step = keys.shape[-2]
        if self.size is not None:  # the sinks and the newest tokens that leave room for these
            room = max(self.size - self._step, self.method.sinks)
            if room < self.keys.shape[-2]:
                self.reduce(room)
        super().append(keys, values, queries)

    def attention_inputs(self):
        keys, values, bias = super().attention_inputs()
        if self.size is None or self._step == 1:
            return keys, values, bias
        # the model's causal mask was sized before room was made: a mask of its own
        total, n, device = keys.shape[-2], self._step, keys.device
        later = (torch.arange(total, device=device)
                 > torch.arange(total - n, total, device=device).unsqueeze(1))
        own = torch.zeros(n, total, device=device).masked_fill(later, float("-inf"))
        return keys, values, own.expand(*keys.shape[:2], n, total)


@register_method("streamingllm")
@dataclass
class StreamingLLM(TokenMethod):
    """StreamingLLM (Xiao et al.): the first `sinks` tokens plus the newest ones, `ratio` of the
    prompt or `budget` tokens in all, held at that size through decode.

    Defaults: sinks 4 as mit-han-lab/streaming-llm streaming_llm/kv_cache.py (start_size=4) and
    kvpress's StreamingLLMPress (n_sink=4). Upstream shifts positions inside the cache; here keys
    keep their original RoPE positions (kvpress without KeyRerotationPress).

    Parameters:
        sinks: int = 4 — the first tokens always kept (attention sinks), within the budget.
    """

    sinks: int = 4

    def __post_init__(self):
        super().__post_init__()
        if self.sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {self.sinks}")

    def new_layer_cache(self, layer_idx: int) -> StreamingCache:
        return StreamingCache(self)


class SnapKVCache(ScorerCache):
    method: "SnapKV"

    def observe(self, queries: torch.Tensor) -> None:
        # only the observation window is needed: keep the newest `window` queries
        super().observe(queries)
        self.observed = [self.observed_queries(last=self.method.window)]

    def _window(self) -> int:
        """The prompt's last queries vote, or a probe taken back (then no window is kept)."""
        return 0 if self.probe is not None else min(self.method.window, self._seen - 1)

    def protected(self, size: int) -> tuple[int, int]:
        return 0, self._window()

    def scores(self) -> torch.Tensor:
        """Votes on the tokens before the window, pooled over those only (as upstream: the
        window's own votes are not pooled into its neighbours); the window is kept anyway."""
        window = self._window()
        queries = self.probe if self.probe is not None else self.observed_queries()
        weights = attention_weights(queries, self.keys, self.scaling, causal=window > 0)
        held = self.keys.shape[-2]
        votes = weights.sum(dim=(1, 2))[:, : held - window].unsqueeze(1)  # (H, 1, prefix)
        pool = (torch.nn.functional.avg_pool1d if self.method.pooling == "avg"
                else torch.nn.functional.max_pool1d)
        k = self.method.kernel
        pooled = pool(votes, k, stride=1, padding=k // 2).squeeze(1)
        return torch.nn.functional.pad(pooled, (0, window))  # the window: protected, not scored


@register_method("snapkv")
@dataclass
class SnapKV(TokenMethod):
    """SnapKV (Li et al.): the prompt's last `window` queries vote with their attention (summed
    over the window and the query heads that share a KV head), votes are pooled (`pooling`,
    `kernel`), and each head keeps its top tokens plus the window, the budget in all. A probe (a
    question fed and taken back before end_prefill) is the observation window instead, when
    given.

    Defaults: FasterDecoding/SnapKV snapkv/monkeypatch/snapkv_utils.py init_snapkv (window_size
    32, kernel_size 5, pooling avgpool); its SnapKVCluster and kvpress's SnapKVPress use window
    64. Upstream selects per query head (repeat_kv first); here per KV head, votes summed over
    its query heads (kvpress averages them: the same choice).

    Parameters:
        window: int = 32 — the prompt's last queries that vote, whose tokens are kept too.
        kernel: int = 5 — width of the pooling over neighbouring tokens' votes.
        pooling: str = "avg" — "avg" or "max" pooling of the votes.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(trim=True, probes=True)
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"ratio": 0.5, "window": 8}, {"budget": 40, "pooling": "max", "kernel": 7})

    window: int = 32
    kernel: int = 5
    pooling: str = "avg"

    def __post_init__(self):
        super().__post_init__()
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be an odd number >= 1, got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)},"
                             f" got {self.pooling!r}")

    def new_layer_cache(self, layer_idx: int) -> SnapKVCache:
        return SnapKVCache(self)


class H2OCache(ScorerCache):
    method: "H2O"
    holds_budget = True

    def __init__(self, method: "H2O"):
        super().__init__(method)
        self.accumulated: torch.Tensor | None = None  # (H, T) attention each held key received

    def append(self, keys, values, queries=None) -> None:
        super().append(keys, values, queries)
        fresh = keys.new_zeros(keys.shape[1], keys.shape[-2], dtype=torch.float32)
        self.accumulated = (fresh if self.accumulated is None
                            else torch.cat([self.accumulated, fresh], dim=-1))

    def observe(self, queries: torch.Tensor) -> None:
        weights = attention_weights(queries, self.keys, self.scaling)
        self.accumulated += weights.sum(dim=(1, 2))

    def scores(self) -> torch.Tensor:
        return self.accumulated

    def protected(self, size: int) -> tuple[int, int]:
        return 0, max(1, round(size * self.method.recent))

    def keep(self, index, values=None, bias=None) -> None:
        super().keep(index, values, bias)
        self.accumulated = self.accumulated.gather(-1, index[0])

    def trim(self, n: int) -> int:
        dropped = super().trim(n)
        self.accumulated = self.accumulated[:, : self.keys.shape[-2]]
        return dropped

    def measured_bytes(self) -> int:
        return super().measured_bytes() + tensor_bytes(self.accumulated)


@register_method("h2o")
@dataclass
class H2O(TokenMethod):
    """H2O (Zhang et al.): heavy hitters by the attention each key has accumulated from every
    query so far, plus the newest `recent` fraction of the budget; held at the budget through
    decode. The accumulated scores (float32 per held key and head) are bookkeeping, counted in
    measured bytes, not in the layout.

    Defaults: recent 0.5 as FMInference/H2O h2o_hf/run_text_generation.py and
    scripts/lm_eval/h2o.sh (heavy_ratio 0.1, recent_ratio 0.1: half of a 0.2 budget is recent).

    Parameters:
        recent: float = 0.5 — the fraction of the budget given to the newest tokens; the rest
            goes to the heavy hitters.
    """

    recent: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.recent < 1:
            raise ValueError(f"recent must be between 0 and 1 (exclusive), got {self.recent}")

    def new_layer_cache(self, layer_idx: int) -> H2OCache:
        return H2OCache(self)
