"""`adaptive`: per-(layer, KV head) bits over any method with a `bits` field, set from the attention
entropy a benchmark measures on calibration tokens: peaked heads get more bits."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvbench.methods.base import Codec, LayerCachePolicy, Method, register_method
from kvbench.methods.widths import MAX_BITS, bit_variants, check_width, nearest_width, refused

MIN_CALIBRATION_TOKENS = 16


# ---- calibration -------------------------------------------------------------------------------

def kv_head_entropy(query_entropy: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(layers, query heads) -> (layers, kv_heads): the mean over each GQA group (query heads
    h * G .. h * G + G - 1 read KV head h, as transformers' repeat_kv lays them out)."""
    layers, heads = query_entropy.shape
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into {kv_heads} KV head groups")
    return query_entropy.view(layers, kv_heads, heads // kv_heads).mean(-1)


# ---- the layer cache ---------------------------------------------------------------------------

@dataclass
class _Group:
    bits: int
    heads: list[int]
    policy: LayerCachePolicy


class AdaptiveCache(LayerCachePolicy):
    """One layer: the KV heads at each width go through one cache of the base method built at that
    width, the heads given to it in order; attention_inputs puts every head back in its place.

    `variants` are {bits: method} with new_layer_cache(); the array operations are _select and
    _place (torch here), which kvbench.methods.mlx.adaptive overrides to run this same logic on
    mx.array with the base's MLX caches."""

    def __init__(self, variants: dict[int, Method], head_bits: list[int] | None, base_bits: int,
                 layer_idx: int):
        self.variants = variants
        self.head_bits = head_bits
        self.base_bits = base_bits
        self.layer_idx = layer_idx
        self.groups: list[_Group] | None = None  # built at the first append, when heads are known
        self._keep_decoded = False  # keep_decoded() was asked: every group's policy is told
        self._index: dict[tuple[int, torch.device, int], torch.Tensor] = {}

    def _build(self, heads: int) -> None:
        bits = self.head_bits if self.head_bits is not None else [self.base_bits] * heads
        if len(bits) != heads:
            raise RuntimeError(f"layer {self.layer_idx}: calibrated for {len(bits)} KV heads,"
                               f" got {heads}")
        self.head_bits = list(bits)
        self.groups = [
            _Group(b, [h for h in range(heads) if bits[h] == b],
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

    def _heads(self, group: int, device: torch.device, per_head: int = 1) -> torch.Tensor:
        """Indices of a group's heads (per_head consecutive query heads per KV head)."""
        key = (group, device, per_head)
        if key not in self._index:
            heads = [h * per_head + j for h in self.groups[group].heads for j in range(per_head)]
            self._index[key] = torch.tensor(heads, device=device)
        return self._index[key]

    def _select(self, x: torch.Tensor, group: int, per_head: int = 1) -> torch.Tensor:
        """The group's heads of x (a copy: a group never pins the whole step's storage)."""
        return x.index_select(1, self._heads(group, x.device, per_head))

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

    def _place(self, parts):
        """Every group's (keys, values, bias or None) put back at its heads' places; a group
        without a bias gets zeros where another group has one."""
        k0 = parts[0][0]
        heads = len(self.head_bits)
        keys = k0.new_empty(k0.shape[0], heads, k0.shape[-2], k0.shape[-1])
        values = parts[0][1].new_empty(k0.shape[0], heads, k0.shape[-2], parts[0][1].shape[-1])
        bias = None
        if any(b is not None for _, _, b in parts):
            bias = k0.new_zeros(k0.shape[0], heads, k0.shape[-2])
        for i, (k, v, b) in enumerate(parts):
            where = self._heads(i, k.device)
            keys[:, where] = k
            values[:, where] = v
            if b is not None:
                bias[:, where] = b
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


# ---- the method --------------------------------------------------------------------------------

@register_method("adaptive")
@dataclass
class Adaptive(Method):
    """Adaptive bits: each (layer, KV head) gets its own width, more for heads whose attention is
    peaked, from a calibration pass.

    Source: TurboQuant+'s adaptive-bits extension as its MLX port (ediestel/turboquant-plus-mlx,
    turboquant/adaptive_bits.py and bit_budget.py's SensitivityCalibratedPolicy): sensitivity =
    -(mean attention entropy), z-scored over all slots, bits = clip(base + scale * z, 1, 8),
    rounded to a width the quantizer has. Defaults: scale 0.5 and the 1..8 clip as its
    AdaptiveBitAllocator (sensitivity_scale=0.5, min_bits=1.0, max_bits=8.0); upstream's
    base_bits is 3.5 (3 here: integer widths) and it rounds half to even, here half up.

    Scheme: wraps any registered method with an integer `bits` field (intq, lloydmax, turbo,
    kivi, ...). calibrate(stats, tokens) takes from the benchmark, per layer and query head, the
    entropy (bits) of each causal attention row over the calibration tokens (at least 16),
    averaged over rows (kvbench.models.session.CalibrationStats: eager attention on torch, the
    same softmax on MLX); query heads are averaged within their GQA group to give one entropy
    per KV head. sensitivity = -entropy; z = (s - mean) / std over every
    (layer, KV head), population std (all z = 0 when std is 0); width = clip(floor(base_bits +
    scale * z + 0.5), 1, 8), then the nearest width the base accepts (a tie goes toward
    base_bits). The mapping is monotone: a lower entropy never gets fewer bits.
    Each layer's cache gives the KV heads at each width to one cache of the base method built at
    that width (its own policy: its window, KIVI's residual), so every head is stored exactly as
    the base stores it at its width; retained bytes are theirs, summed.
    Without calibrate() (e.g. the proofs benchmark, which only uses codec()) every head is at
    base_bits and this is the base method at base_bits.
    Reported: layout() gives the mean width, heads per width and every layer's widths; counters
    kv_heads_<b>bit (summed over layers: the model's KV heads at each width).

    Parameters:
        base: str = "turbo" — the method each head is stored with; it needs an integer `bits`
            field.
        base_params: dict = {} — the base's parameters, without bits.
        base_bits: int = 3 — the centre width (1..8); the base must accept it.
        scale: float = 0.5 — bits per standard deviation of sensitivity (>= 0; 0 keeps every head
            at base_bits), upstream's sensitivity_scale default.
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).
    In a suite: `{name: adaptive, params: {base: turbo, base_params: {block: 64}, base_bits: 3,
    scale: 1.0}}`; benchmarks that calibrate (perplexity: its `calibration` tokens, after the
    scored ones) call calibrate().

    codec(), key_codec() and value_codec() are the base's at base_bits.
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({"base_params": {"block": 16}},)

    base: str = "turbo"
    base_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    base_bits: int = 3
    scale: float = 0.5

    def __post_init__(self):
        check_width("base_bits", self.base_bits)
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)
                and self.scale >= 0):
            raise ValueError(f"scale must be a finite number >= 0, got {self.scale!r}")
        self._variants = bit_variants(self.base, self.base_params, range(1, MAX_BITS + 1))
        if self.base_bits not in self._variants:
            raise refused("base_bits", self.base_bits, self.base, self._variants, self.base_params)
        self.entropy: torch.Tensor | None = None  # (layers, kv_heads), bits, after calibrate()
        self.head_bits: list[list[int]] | None = None  # [layer][kv_head], after calibrate()

    def widths(self) -> list[int]:
        """The widths the base accepts with base_params, among 1..8."""
        return sorted(self._variants)

    def variant(self, bits: int) -> Method:
        """The base method built with base_params at `bits` (one of widths())."""
        return self._variants[bits]

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        """Sets every head's width from the attention entropy of `tokens`. `stats` is what the
        benchmark's session hands over (kvbench.models.session.CalibrationStats, on either
        backend): its attention_entropy() (layers, query heads) and num_kv_heads."""
        if len(tokens) < MIN_CALIBRATION_TOKENS:
            raise ValueError(f"adaptive calibration needs at least {MIN_CALIBRATION_TOKENS}"
                             f" tokens, got {len(tokens)}")
        if not callable(getattr(stats, "attention_entropy", None)):
            raise TypeError("adaptive calibrates from the attention entropy a benchmark measures"
                            " (kvbench.models.session.CalibrationStats; session.calibrate(method,"
                            f" tokens) makes it), got {type(stats).__name__}")
        entropy = kv_head_entropy(stats.attention_entropy(), stats.num_kv_heads)
        self.entropy = entropy
        self.head_bits = self.allocate(entropy)

    def allocate(self, entropy: torch.Tensor) -> list[list[int]]:
        """Widths for a (layers, kv_heads) entropy table, by the rule in the docstring."""
        sensitivity = -entropy.double()
        std = sensitivity.std(unbiased=False) if sensitivity.numel() > 1 else torch.tensor(0.0)
        if std <= 1e-12 * max(1.0, sensitivity.abs().max().item()):
            z = torch.zeros_like(sensitivity)
        else:
            z = (sensitivity - sensitivity.mean()) / std
        target = torch.floor(self.base_bits + self.scale * z + 0.5).clamp(1, MAX_BITS)
        widths = self.widths()
        return [[nearest_width(int(t), widths, tie_toward=self.base_bits) for t in row]
                for row in target.tolist()]

    def bits_per_head(self, layer_idx: int) -> list[int] | None:
        """The widths of a layer's KV heads, or None before calibrate() (all at base_bits)."""
        if self.head_bits is None:
            return None
        if not 0 <= layer_idx < len(self.head_bits):
            raise ValueError(f"layer {layer_idx}: calibrated for {len(self.head_bits)} layers")
        return self.head_bits[layer_idx]

    def new_layer_cache(self, layer_idx: int) -> AdaptiveCache:
        return AdaptiveCache(self._variants, self.bits_per_head(layer_idx), self.base_bits,
                             layer_idx)

    def codec(self) -> Codec | None:
        return self._variants[self.base_bits].codec()

    def key_codec(self) -> Codec | None:
        return self._variants[self.base_bits].key_codec()

    def value_codec(self) -> Codec | None:
        return self._variants[self.base_bits].value_codec()

    def layout(self) -> str:
        base = self._variants[self.base_bits].layout()
        if self.head_bits is None:
            return (f"adaptive over {self.base}: every KV head at base_bits {self.base_bits}"
                    f" (not calibrated): {base}")
        flat = [b for row in self.head_bits for b in row]
        counts = Counter(flat)
        per_width = ", ".join(f"{counts[b]} at {b}" for b in sorted(counts))
        per_layer = " ".join(",".join(str(b) for b in row) for row in self.head_bits)
        return (
            f"adaptive over {self.base}: per-KV-head bits from attention entropy (scale "
            f"{self.scale:g}), mean {sum(flat) / len(flat):.3f} bits over {len(flat)} heads "
            f"({per_width}); per layer [{per_layer}]; at base_bits {self.base_bits}: {base}"
        )
