"""What a model's cache adapter (transformers or mlx-lm) checks and reports about its layers'
policies."""
from __future__ import annotations

from kvbench.methods.core.contracts import LayerCachePolicy


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


def check_attention_inputs(policy: LayerCachePolicy, layer_idx: int, keys_shape: tuple,
                           bias_shape: tuple | None, query_length: int,
                           mask_kv_length: int | None) -> None:
    """A policy that keeps nothing, more than it saw, or not what it reports, or whose bias does
    not fit the keys it returned, is a bug: both adapters call this after every append.
    mask_kv_length: the keys the model's one shared causal mask was sized for (None: none yet).
    A one-token step needs no mask; a longer one uses it, which only fits if this layer returned
    as many keys, unless its per-query bias replaces the mask."""
    name = type(policy).__name__
    seen, retained, summaries = policy.seen_tokens, policy.retained_tokens, policy.summary_slots
    if not 0 < retained <= seen:
        raise RuntimeError(f"layer {layer_idx}: {name} retains {retained} tokens after seeing"
                           f" {seen} (must be between 1 and the tokens seen)")
    if keys_shape[-2] != retained + summaries:
        raise RuntimeError(f"layer {layer_idx}: {name} returned {keys_shape[-2]} keys but reports"
                           f" {retained} retained tokens and {summaries} summaries")
    allowed = (tuple(keys_shape[:-1]),
               (*keys_shape[:-2], query_length, keys_shape[-2]))
    if bias_shape is not None and tuple(bias_shape) not in allowed:
        raise RuntimeError(
            f"layer {layer_idx}: {name} returned a key bias of shape {tuple(bias_shape)}; it must"
            f" be (batch, kv_heads, keys) = {allowed[0]} or per query {allowed[1]}")
    own_mask = bias_shape is not None and len(bias_shape) == 4
    if query_length > 1 and not own_mask and mask_kv_length not in (None, keys_shape[-2]):
        raise RuntimeError(
            f"layer {layer_idx}: {keys_shape[-2]} keys for a {query_length}-token step, but the"
            f" causal mask was sized for {mask_kv_length}; a policy that drops tokens inside a"
            " multi-token step, or keeps a different count per layer, needs one-token decode"
            " steps")
