"""What a request's cache will hold, in the method's accounted bytes, before it is admitted.

Every kvbench method's accounted bytes depend on how many tokens its policies saw, not on their
values (bit widths, groups, windows, eviction and compaction budgets are all counts), so a cache
of the method fed random keys and values of the same shapes says exactly what the request's
cache will account: the prompt in one append (with random queries for policies that read them),
end_prefill, then the new tokens one by one (the keys are read once, at the end: no accounted
figure depends on a read). The reservation is the larger of the bytes after end_prefill
and after the last new token. Sizes are memoised per (prompt, max_tokens).
"""
from __future__ import annotations

import functools

import torch

from kvbench.methods.core.contracts import Implementation


class Projection:
    def __init__(self, method: Implementation, session):
        config = session.loaded.model.config.get_text_config()
        self.method = method
        self.num_layers, self.kv_heads, self.head_dim = (
            session.num_layers, session.num_kv_heads, session.head_dim)
        self.query_heads = config.num_attention_heads
        self.dtype = session.loaded.dtype

    @functools.lru_cache(maxsize=256)
    def bytes(self, prompt: int, new_tokens: int) -> int:
        """Accounted bytes, summed over layers, of a cache that took `prompt` tokens, ended its
        prefill, and took `new_tokens` - 1 more (the last sampled token is never fed)."""
        generator = torch.Generator().manual_seed(0)
        total = 0
        for layer in range(self.num_layers):
            policy = self.method.new_layer_cache(layer)
            self._feed(policy, prompt, generator)
            policy.end_prefill()
            after_prefill = policy.retained_bytes
            for _ in range(new_tokens - 1):
                self._feed(policy, 1, generator)
            policy.attention_inputs()
            total += max(after_prefill, policy.retained_bytes)
        return total

    def _feed(self, policy, tokens: int, generator: torch.Generator) -> None:
        def random(heads: int) -> torch.Tensor:
            return torch.randn(1, heads, tokens, self.head_dim, generator=generator,
                               dtype=self.dtype)

        policy.append(random(self.kv_heads), random(self.kv_heads))
        if policy.observes_queries:
            policy.observe_queries(random(self.query_heads))
