"""Eviction references: `streamingllm`, `snapkv`, `h2o`. Each keeps full-precision tokens and
drops the rest; all reduce the prompt at end_prefill (the prompt's forward itself is exact), or
with evict every_chunk while it is fed (streamingllm makes room before every forward, snapkv and
h2o reduce after every forward's attention); the fixed-size ones (streamingllm, h2o) keep their
budget through decode by evicting after every step, one token or many. Budgets are a ratio of
the prompt or a fixed number of tokens per head; budget, protected tokens, top-k and gather live
in kvbench.methods.torch.token_cache.ScorerCache.
"""
from __future__ import annotations

import torch

from kvbench.backends.torch_arrays import tensor_bytes
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.eviction import H2O, SnapKV, StreamingLLM
from kvbench.methods.torch.token_cache import ScorerCache, attention_received


@implements(StreamingLLM)
class StreamingCache(ScorerCache):
    """The sinks and a window of the newest tokens: no scores needed. As upstream's
    evict_for_space, room is made before each decode step, so a step attends over the budget,
    its own tokens included; a multi-token step gets its own causal mask over what is kept."""

    reads_queries = False
    holds_budget = True

    def __init__(self, method: StreamingLLM):
        super().__init__(method)
        self._step = 0  # tokens in the latest append

    def protected(self, size: int) -> tuple[int, int]:
        return self.method.sinks, size - self.method.sinks

    def budget_tokens(self, prompt: int | None = None) -> int:
        size = super().budget_tokens(prompt)
        if size <= self.method.sinks:
            raise ValueError(f"streamingllm: a budget of {size} tokens leaves no window after"
                             f" {self.method.sinks} sink tokens")
        return size

    def end_prefill(self) -> None:
        super().end_prefill()
        self.observes_queries = False  # room is made before a step, not after it
        self._step = 0  # compacted: no step since, whose queries a mask of its own would face

    def append(self, keys, values, queries=None) -> None:
        self._step = keys.shape[-2]
        if self.size is not None and self.keys is not None:
            # the sinks and the newest tokens that leave room for these
            room = max(self.size - self._step, self.method.sinks)
            if room < self.keys.shape[-2]:
                self.reduce(room)
        super().append(keys, values, queries)

    def attention_inputs(self):
        keys, values, bias = super().attention_inputs()
        if self.size is None or self._step <= 1:
            return keys, values, bias
        # the model's causal mask was sized before room was made: a mask of its own
        total, n, device = keys.shape[-2], self._step, keys.device
        later = (torch.arange(total, device=device)
                 > torch.arange(total - n, total, device=device).unsqueeze(1))
        own = torch.zeros(n, total, device=device).masked_fill(later, float("-inf"))
        return keys, values, own.expand(*keys.shape[:2], n, total)


@implements(SnapKV)
class SnapKVCache(ScorerCache):
    method: SnapKV

    @classmethod
    def queries_read(cls, method: SnapKV) -> int | None:
        return method.window

    def observe(self, queries: torch.Tensor) -> None:
        # only the observation window is needed: keep the newest `window` queries, copied so
        # that the chunk's queries they were cut from are freed
        super().observe(queries)
        self.observed = [self.observed_queries(last=self.method.window).clone()]

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
        received = attention_received(queries, self.keys, self.scaling, causal=window > 0)
        held = self.keys.shape[-2]
        votes = received[:, : held - window].unsqueeze(1)  # (H, 1, prefix)
        pool = (torch.nn.functional.avg_pool1d if self.method.pooling == "avg"
                else torch.nn.functional.max_pool1d)
        k = self.method.kernel
        pooled = pool(votes, k, stride=1, padding=k // 2).squeeze(1)
        return torch.nn.functional.pad(pooled, (0, window))  # the window: protected, not scored


@implements(H2O)
class H2OCache(ScorerCache):
    method: H2O
    holds_budget = True

    def __init__(self, method: H2O):
        super().__init__(method)
        self.accumulated: torch.Tensor | None = None  # (H, T) attention each held key received

    def append(self, keys, values, queries=None) -> None:
        super().append(keys, values, queries)
        fresh = keys.new_zeros(keys.shape[1], keys.shape[-2], dtype=torch.float32)
        self.accumulated = (fresh if self.accumulated is None
                            else torch.cat([self.accumulated, fresh], dim=-1))

    def observe(self, queries: torch.Tensor) -> None:
        self.accumulated += attention_received(queries, self.keys, self.scaling)

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
