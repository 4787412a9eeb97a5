"""Eviction references: `streamingllm`, `snapkv`, `h2o`. Each keeps full-precision tokens and
drops the rest; all reduce the prompt at end_prefill (the prompt's forward itself is exact), and
the fixed-size ones (streamingllm, h2o) keep their budget through decode by evicting at every
step. Budgets are a ratio of the prompt or a fixed number of tokens per head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.methods.base import register_method
from kvbench.methods.token_cache import Budget, TokenCache, TokenMethod, attention_weights


class StreamingCache(TokenCache):
    def __init__(self, budget: Budget, sinks: int):
        super().__init__()
        self.budget, self.sinks = budget, sinks
        self.size: int | None = None  # tokens kept from the end of the prompt on

    def end_prefill(self) -> None:
        self.size = self.budget.tokens(self._seen)
        if self.size <= self.sinks:
            raise ValueError(f"streamingllm: a budget of {self.size} tokens leaves no window"
                             f" after {self.sinks} sink tokens")
        self._evict()

    def append(self, keys, values, queries=None) -> None:
        super().append(keys, values, queries)
        if self.size is not None and keys.shape[-2] == 1:
            # one-token steps only: a longer step's causal mask was sized before it
            self._evict()

    def _evict(self) -> None:
        held = self.keys.shape[-2]
        window = self.size - self.sinks
        index = torch.cat([torch.arange(self.sinks), torch.arange(held - window, held)])
        self.keep(index.expand(1, self.keys.shape[1], -1))


@register_method("streamingllm")
@dataclass
class StreamingLLM(TokenMethod):
    """StreamingLLM (Xiao et al.): the first `sinks` tokens plus the newest ones, `ratio` of the
    prompt or `budget` tokens in all, held at that size through decode."""

    sinks: int = 4

    def __post_init__(self):
        super().__post_init__()
        if self.sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {self.sinks}")

    def new_layer_cache(self, layer_idx: int) -> StreamingCache:
        return StreamingCache(self, self.sinks)


class SnapKVCache(TokenCache):
    observes_queries = True

    def __init__(self, method: "SnapKV"):
        super().__init__()
        self.method = method

    def observe_queries(self, queries: torch.Tensor) -> None:
        # only the observation window is needed: keep the newest `window` queries
        super().observe_queries(queries)
        self.observed = [self.observed_queries(last=self.method.window)]

    def end_prefill(self) -> None:
        self.observes_queries = False
        m, prompt = self.method, self._seen
        keep = m.tokens(prompt)
        # The observation window: the prompt's last `window` queries, or a probe taken back.
        if self.probe is not None:
            queries, window = self.probe, 0
        else:
            queries, window = self.observed_queries(), min(m.window, prompt - 1)
        if keep <= window:
            raise ValueError(f"snapkv: a budget of {keep} tokens is not above the observation"
                             f" window of {window}")
        weights = attention_weights(queries, self.keys, self.scaling, causal=window > 0)
        votes = weights.sum(dim=(1, 2))[:, : prompt - window]  # (H, prefix)
        pooled = torch.nn.functional.max_pool1d(votes.unsqueeze(1), m.kernel, stride=1,
                                                padding=m.kernel // 2).squeeze(1)
        top = pooled.topk(keep - window, dim=-1).indices.sort(dim=-1).values
        recent = torch.arange(prompt - window, prompt).expand(top.shape[0], -1)
        self.keep(torch.cat([top, recent], dim=-1).unsqueeze(0))
        self.observed, self.probe = [], None


@register_method("snapkv")
@dataclass
class SnapKV(TokenMethod):
    """SnapKV (Li et al.): the prompt's last `window` queries vote with their attention (summed
    over the window and the query heads that share a KV head), votes are max-pooled with
    `kernel`, and each head keeps its top tokens plus the window, the budget in all. A probe (a
    question fed and taken back before end_prefill) is the observation window instead, when
    given."""

    window: int = 32
    kernel: int = 7

    def __post_init__(self):
        super().__post_init__()
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be an odd number >= 1, got {self.kernel}")

    def new_layer_cache(self, layer_idx: int) -> SnapKVCache:
        return SnapKVCache(self)


class H2OCache(TokenCache):
    observes_queries = True

    def __init__(self, method: "H2O"):
        super().__init__()
        self.method = method
        self.scores: torch.Tensor | None = None  # (H, T) attention each held key received
        self.size: int | None = None

    def append(self, keys, values, queries=None) -> None:
        super().append(keys, values, queries)
        fresh = torch.zeros(keys.shape[1], keys.shape[-2])
        self.scores = fresh if self.scores is None else torch.cat([self.scores, fresh], dim=-1)

    def observe_queries(self, queries: torch.Tensor) -> None:
        weights = attention_weights(queries, self.keys, self.scaling)
        self.scores += weights.sum(dim=(1, 2))
        if self.size is not None and queries.shape[-2] == 1:
            self._evict()

    def trim(self, n: int) -> int:
        dropped = super().trim(n)
        self.scores = self.scores[:, : self.keys.shape[-2]]
        return dropped

    def end_prefill(self) -> None:
        self.size = self.method.tokens(self._seen)
        self._evict()

    def _evict(self) -> None:
        held = self.keys.shape[-2]
        if held <= self.size:
            return
        recent = max(1, round(self.size * self.method.recent))
        heavy = self.size - recent
        top = self.scores[:, : held - recent].topk(heavy, dim=-1).indices.sort(dim=-1).values
        index = torch.cat([top, torch.arange(held - recent, held).expand(top.shape[0], -1)], -1)
        self.keep(index.unsqueeze(0))
        self.scores = self.scores.gather(-1, index)

    def measured_bytes(self) -> int:
        return super().measured_bytes() + self.scores.numel() * self.scores.element_size()


@register_method("h2o")
@dataclass
class H2O(TokenMethod):
    """H2O (Zhang et al.): heavy hitters by the attention each key has accumulated from every
    query so far, plus the newest `recent` fraction of the budget; held at the budget through
    decode. The accumulated scores (float32 per held key and head) are bookkeeping, counted in
    measured bytes, not in the layout."""

    recent: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.recent < 1:
            raise ValueError(f"recent must be between 0 and 1 (exclusive), got {self.recent}")

    def new_layer_cache(self, layer_idx: int) -> H2OCache:
        return H2OCache(self)
