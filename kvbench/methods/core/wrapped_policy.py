"""A policy that wraps another (sparse-V, an MLX bridge to a torch policy, a test's spy): what
it does not override goes to the policy inside."""
from __future__ import annotations

from kvbench.methods.core.contracts import LayerCachePolicy


def _forwarded(name: str) -> property:
    """A read-only property that reads the wrapped policy's."""
    return property(lambda self: getattr(self.inner, name))


class WrappedPolicy(LayerCachePolicy):
    """Stores exactly what `inner` stores and forwards every call to it; a subclass changes only
    how attention reads it (sparse-V) or what arrays cross over (MLX bridging)."""

    def __init__(self, inner: LayerCachePolicy):
        self.inner = inner

    def append(self, keys, values, queries=None) -> None:
        self.inner.append(keys, values, queries)

    def take_prompt(self, keys, values, key_buffer, value_buffer) -> bool:
        return self.inner.take_prompt(keys, values, key_buffer, value_buffer)

    def attention_inputs(self):
        return self.inner.attention_inputs()

    def attention_parts(self, part_bytes: int):
        return self.inner.attention_parts(part_bytes)

    def observe_queries(self, queries) -> None:
        self.inner.observe_queries(queries)

    def begin_prompt(self, tokens: int) -> None:
        self.inner.begin_prompt(tokens)

    def reserve(self, tokens: int) -> None:
        self.inner.reserve(tokens)

    def end_prefill(self) -> None:
        self.inner.end_prefill()

    def after_read(self) -> None:
        self.inner.after_read()

    def trim(self, n: int) -> int:
        return self.inner.trim(n)

    def holds_exactly(self, newest: int) -> bool:
        return self.inner.holds_exactly(newest)

    def keep_decoded(self) -> bool:
        return self.inner.keep_decoded()

    observes_queries = _forwarded("observes_queries")
    summary_slots = _forwarded("summary_slots")
    seen_tokens = _forwarded("seen_tokens")
    retained_tokens = _forwarded("retained_tokens")
    retained_bytes = _forwarded("retained_bytes")

    def measured_bytes(self) -> int:
        return self.inner.measured_bytes()

    def counters(self) -> dict[str, float]:
        return self.inner.counters()
