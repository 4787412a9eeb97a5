"""Adaptive bits' layer cache: the KV heads at each width stored by the base's cache at that
width, put back in their places for attention (kvbench.methods.settings.adaptive)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench.methods.core.contracts import LayerCachePolicy, ReadPart


@dataclass
class Group:
    bits: int
    heads: list[int]
    policy: LayerCachePolicy


class AdaptiveCache(LayerCachePolicy):
    """One layer: the KV heads at each width go through one cache of the base method built at that
    width, the heads given to it in order; attention_inputs puts every head back in its place.

    `variants` are {bits: the base's implementation at that width} with new_layer_cache(), on
    the arrays `ops` (kvbench.backends.arrays.Arrays): torch and MLX run this same logic."""

    def __init__(self, variants: dict[int, Any], head_bits: list[int] | None, base_bits: int,
                 layer_idx: int, ops):
        self.ops = ops
        self.variants = variants
        self.head_bits = head_bits
        self.base_bits = base_bits
        self.layer_idx = layer_idx
        self.groups: list[Group] | None = None  # built at the first append, when heads are known
        self._keep_decoded = False  # keep_decoded() was asked: every group's policy is told

    def _build(self, heads: int) -> None:
        bits = self.head_bits if self.head_bits is not None else [self.base_bits] * heads
        if len(bits) != heads:
            raise RuntimeError(f"layer {self.layer_idx}: calibrated for {len(bits)} KV heads,"
                               f" got {heads}")
        self.head_bits = list(bits)
        self.groups = [
            Group(b, [h for h in range(heads) if bits[h] == b],
                  self.variants[b].new_layer_cache(self.layer_idx))
            for b in sorted(set(bits))
        ]
        if self._keep_decoded:
            for group in self.groups:
                group.policy.keep_decoded()

    def keep_decoded(self) -> bool:
        """Forwarded to each width's policy when the groups are built (at the first append);
        whether they take it is answered now, from a fresh policy of each width in use."""
        if self.groups is not None:
            raise RuntimeError("AdaptiveCache.keep_decoded() must be called before the first"
                               " append")
        self._keep_decoded = True
        widths = set(self.head_bits) if self.head_bits is not None else {self.base_bits}
        return any([self.variants[b].new_layer_cache(self.layer_idx).keep_decoded()
                    for b in sorted(widths)])

    def _select(self, x, group: int, per_head: int = 1):
        """The group's heads of x (per_head consecutive query heads per KV head; a copy: a group
        never pins the whole step's storage)."""
        heads = [h * per_head + j for h in self.groups[group].heads for j in range(per_head)]
        return self.ops.take(x, heads, axis=1)

    def append(self, keys, values, queries=None) -> None:
        if self.groups is None:
            self._build(keys.shape[1])
        if len(self.groups) == 1:
            self.groups[0].policy.append(keys, values, queries)
            return
        per_head = None if queries is None else queries.shape[1] // keys.shape[1]
        for i, group in enumerate(self.groups):
            q = None if queries is None else self._select(queries, i, per_head)
            group.policy.append(self._select(keys, i), self._select(values, i), q)

    def end_prefill(self) -> None:
        for group in self.groups or []:
            group.policy.end_prefill()

    def attention_inputs(self):
        parts = [group.policy.attention_inputs() for group in self.groups]
        if len(parts) == 1:
            return parts[0]
        tokens = {k.shape[-2] for k, _, _ in parts}
        if len(tokens) != 1:
            raise RuntimeError(f"layer {self.layer_idx}: head groups keep {sorted(tokens)} tokens")
        return self._place(parts)

    def attention_parts(self, part_bytes: int) -> list[ReadPart] | None:
        """Each width's parts (its share of part_bytes, by its heads), part i of every width
        put back at their heads' places when read; None where any width reads whole or the
        widths cut their tokens apart differently."""
        if len(self.groups) == 1:
            return self.groups[0].policy.attention_parts(part_bytes)
        heads = sum(len(group.heads) for group in self.groups)
        split = [group.policy.attention_parts(part_bytes * len(group.heads) // heads)
                 for group in self.groups]
        if None in split or len({tuple(part.tokens for part in parts) for parts in split}) > 1:
            return None

        def placed(pieces):
            return lambda: self._place([(*piece.make(), None) for piece in pieces])[:2]
        return [ReadPart(pieces[0].tokens, placed(pieces)) for pieces in zip(*split)]

    def _place(self, parts):
        """Every group's (keys, values, bias or None) put back at its heads' places: joined along
        heads, then taken back in head order (values are moved, never computed); a group
        without a bias gets zeros where another group has one."""
        order = [h for group in self.groups for h in group.heads]
        inverse = sorted(range(len(order)), key=order.__getitem__)
        keys = self.ops.take(self.ops.concat([k for k, _, _ in parts], axis=1), inverse, axis=1)
        values = self.ops.take(self.ops.concat([v for _, v, _ in parts], axis=1), inverse, axis=1)
        bias = None
        if any(b is not None for _, _, b in parts):
            biases = [b if b is not None else self.ops.zeros(k.shape[:-1], like=k)
                      for k, _, b in parts]
            bias = self.ops.take(self.ops.concat(biases, axis=1), inverse, axis=1)
        return keys, values, bias

    @property
    def seen_tokens(self) -> int:
        return 0 if self.groups is None else self.groups[0].policy.seen_tokens

    @property
    def retained_tokens(self) -> int:
        return 0 if self.groups is None else self.groups[0].policy.retained_tokens

    @property
    def retained_bytes(self) -> int:
        return sum(group.policy.retained_bytes for group in self.groups or [])

    def measured_bytes(self) -> int:
        return sum(group.policy.measured_bytes() for group in self.groups or [])

    def group_bytes(self) -> dict[int, int]:
        """Accounted bytes of the heads at each width."""
        return {group.bits: group.policy.retained_bytes for group in self.groups or []}

    def counters(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for group in self.groups or []:
            for name, value in group.policy.counters().items():
                totals[name] = totals.get(name, 0.0) + value
            # summed over layers by the cache: how many KV heads sit at each width
            totals[f"kv_heads_{group.bits}bit"] = float(len(group.heads))
        return totals
