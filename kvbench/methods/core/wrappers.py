"""The methods that wrap another (sparse_v, decay, adaptive), on any backend: each holds its
base's implementation on the same backend (built at each width it uses, for decay and adaptive)
and the array seam, so torch and MLX run them by the same code."""
from __future__ import annotations

from collections import Counter
from typing import Any

from kvbench.methods.core.adaptive_cache import AdaptiveCache
from kvbench.methods.core.contracts import (
    Codec, Implementation, SharesExactPrefill, codecs_layout,
)
from kvbench.methods.core.decay_cache import DecayCache
from kvbench.methods.core.sparse_v_cache import SparseVCache
from kvbench.methods.settings.adaptive import MIN_CALIBRATION_TOKENS, Adaptive
from kvbench.methods.settings.base import BACKENDS, implements
from kvbench.methods.settings.decay import Decay
from kvbench.methods.settings.sparse_v import SparseV
from kvbench.methods.settings.wrapped import MAX_BITS, nearest_width


def on_every_backend(settings_cls: type):
    """Register the decorated implementation for `settings_cls` on every backend."""
    def register(cls: type) -> type:
        for backend in BACKENDS:
            implements(settings_cls, backend=backend)(cls)
        return cls
    return register


@on_every_backend(SparseV)
class SparseVMethod(Implementation):
    """Sparse-V: its cache holds no array of its own; the base's cache on the same backend is
    read sparsely by that backend's attention, which tells it what it skipped."""

    settings: SparseV

    def __init__(self, settings: SparseV, on):
        super().__init__(settings, on)
        self.base = on.implement(settings.base_settings)

    def new_layer_cache(self, layer_idx: int) -> SparseVCache:
        return SparseVCache(self.base.new_layer_cache(layer_idx), self.settings.tau)

    def new_window_cache(self, layer_idx: int, window: int) -> SparseVCache:
        return SparseVCache(self.base.new_window_cache(layer_idx, window), self.settings.tau)

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        self.base.calibrate(stats, tokens)

    # its prefill is its base's: the attention skips value rows at one-token steps only
    @property
    def shares_prefill(self) -> bool:
        return self.base.shares_prefill

    @property
    def shares_chunked_prefill(self) -> bool:
        return self.base.shares_chunked_prefill

    @property
    def prompt_queries(self) -> int | None:
        return self.base.prompt_queries

    def key_codec(self) -> Codec | None:
        return self.base.key_codec()

    def value_codec(self) -> Codec | None:
        return self.base.value_codec()

    def layout(self) -> str:
        return f"{self.base.layout()}; sparse-V at decode, tau {self.settings.tau:g}"


@on_every_backend(Decay)
class DecayMethod(SharesExactPrefill):
    """Temporal decay: segments stored by the base's key and value codecs at each width in
    settings.widths(); the schedule is the settings'."""

    settings: Decay

    def __init__(self, settings: Decay, on):
        super().__init__(settings, on)
        bases = {bits: on.implement(settings.variant(bits)) for bits in settings.widths()}
        self._codecs = {bits: (base.key_codec(), base.value_codec())
                        for bits, base in bases.items()}
        # where the base chooses its implementation, every width's codecs note into one log
        self.impl_log = bases[settings.base_bits].impl_log
        for codec in (codec for pair in self._codecs.values() for codec in pair):
            codec.impl_log = self.impl_log

    def codecs(self, bits: int) -> tuple[Codec, Codec]:
        return self._codecs[bits]

    def key_codec(self) -> Codec:
        return self._codecs[self.settings.base_bits][0]

    def value_codec(self) -> Codec:
        return self._codecs[self.settings.base_bits][1]

    def new_layer_cache(self, layer_idx: int) -> DecayCache:
        return DecayCache(self.settings, self.codecs, self.on.arrays)

    def layout(self) -> str:
        s = self.settings
        widths = ", ".join(str(b) for b in s.widths())
        return (
            f"decay over {s.base}: segments of {s.segment} tokens start at "
            f"{s.base_bits} bits ({codecs_layout(*self._codecs[s.base_bits])}) and are "
            f"requantized down to {s.min_bits} bits (widths {widths}) as "
            f"exp(-{s.decay_rate:g} * age / (T - 1)) falls, {s.min_bits} bits below "
            f"{s.min_below:g}, evicted below {s.evict_below:g}; newest {s.window} tokens "
            f"(and up to {s.segment - 1} more awaiting a whole segment) full precision; "
            "K and V both counted"
        )


def kv_head_entropy(query_entropy, kv_heads: int):
    """(layers, query heads) -> (layers, kv_heads): the mean over each GQA group (query heads
    h * G .. h * G + G - 1 read KV head h, as transformers' repeat_kv lays them out)."""
    layers, heads = query_entropy.shape
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into {kv_heads} KV head groups")
    return query_entropy.view(layers, kv_heads, heads // kv_heads).mean(-1)


@on_every_backend(Adaptive)
class AdaptiveMethod(SharesExactPrefill):
    """Adaptive bits: each KV head stored by the base's cache at its own width (the base's
    implementation at every width in settings.widths()), the widths set by calibrate()."""

    settings: Adaptive

    def __init__(self, settings: Adaptive, on):
        super().__init__(settings, on)
        self.variants = {bits: on.implement(settings.variant(bits))
                         for bits in settings.widths()}
        self.entropy = None  # (layers, kv_heads), bits, after calibrate()
        self.head_bits: list[list[int]] | None = None  # [layer][kv_head], after calibrate()

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

    def allocate(self, entropy) -> list[list[int]]:
        """Widths for a (layers, kv_heads) entropy tensor, by the rule in the settings'
        docstring."""
        s = self.settings
        sensitivity = -entropy.double()
        # a layer without attention (NaN: linear attention, Mamba) is not compressed; it takes
        # no part in the statistics and gets base_bits
        measured = sensitivity[sensitivity.isfinite()]
        std = measured.std(unbiased=False) if measured.numel() > 1 else 0.0
        if std <= 1e-12 * max(1.0, measured.abs().max().item()):
            z = sensitivity.new_zeros(sensitivity.shape)
        else:
            z = ((sensitivity - measured.mean()) / std).nan_to_num(0.0)
        target = (s.base_bits + s.scale * z + 0.5).floor().clamp(1, MAX_BITS)
        widths = s.widths()
        return [[nearest_width(int(t), widths, tie_toward=s.base_bits) for t in row]
                for row in target.tolist()]

    def bits_per_head(self, layer_idx: int) -> list[int] | None:
        """The widths of a layer's KV heads, or None before calibrate() (all at base_bits)."""
        if self.head_bits is None:
            return None
        if not 0 <= layer_idx < len(self.head_bits):
            raise ValueError(f"layer {layer_idx}: calibrated for {len(self.head_bits)} layers")
        return self.head_bits[layer_idx]

    def new_layer_cache(self, layer_idx: int) -> AdaptiveCache:
        return AdaptiveCache(self.variants, self.bits_per_head(layer_idx),
                             self.settings.base_bits, layer_idx, self.on.arrays)

    def codec(self) -> Codec | None:
        return self.variants[self.settings.base_bits].codec()

    def key_codec(self) -> Codec | None:
        return self.variants[self.settings.base_bits].key_codec()

    def value_codec(self) -> Codec | None:
        return self.variants[self.settings.base_bits].value_codec()

    def layout(self) -> str:
        s = self.settings
        base = self.variants[s.base_bits].layout()
        if self.head_bits is None:
            return (f"adaptive over {s.base}: every KV head at base_bits {s.base_bits}"
                    f" (not calibrated): {base}")
        flat = [b for row in self.head_bits for b in row]
        counts = Counter(flat)
        per_width = ", ".join(f"{counts[b]} at {b}" for b in sorted(counts))
        per_layer = " ".join(",".join(str(b) for b in row) for row in self.head_bits)
        return (
            f"adaptive over {s.base}: per-KV-head bits from attention entropy (scale "
            f"{s.scale:g}), mean {sum(flat) / len(flat):.3f} bits over {len(flat)} heads "
            f"({per_width}); per layer [{per_layer}]; at base_bits {s.base_bits}: {base}"
        )
