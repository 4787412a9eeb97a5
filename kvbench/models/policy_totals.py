"""What a model's cache adapter (transformers or mlx-lm) reports about its layers' policies."""
from __future__ import annotations

from kvbench.methods.base import LayerCachePolicy


class PolicyTotals:
    """Sums over a cache's per-layer policies; `layers` hold one `.policy` each."""

    layers: list

    @property
    def policies(self) -> list[LayerCachePolicy]:
        return [layer.policy for layer in self.layers]

    def end_prefill(self) -> None:
        for policy in self.policies:
            policy.end_prefill()

    def accounted_bytes(self) -> int:
        """What the methods' layouts store, keys and values, summed over layers."""
        return sum(policy.retained_bytes for policy in self.policies)

    def measured_bytes(self) -> int:
        """Bytes of the arrays the policies actually hold right now."""
        return sum(policy.measured_bytes() for policy in self.policies)

    def retained_tokens(self) -> list[int]:
        return [policy.retained_tokens for policy in self.policies]

    def counters(self) -> dict[str, float]:
        """The policies' counters, summed over layers."""
        totals: dict[str, float] = {}
        for policy in self.policies:
            for name, value in policy.counters().items():
                totals[name] = totals.get(name, 0.0) + value
        return totals
