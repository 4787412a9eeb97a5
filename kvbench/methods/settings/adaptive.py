"""`adaptive`: per-(layer, KV head) bits over any method with a `bits` field, set from the
attention entropy a benchmark measures on calibration tokens: peaked heads get more bits."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, at_least, param, span
from kvbench.methods.settings.base import MethodSettings, register_method
from kvbench.methods.settings.wrapped import MAX_BITS, BitWidths, bit_variants, refused

MIN_CALIBRATION_TOKENS = 16


@register_method("adaptive")
@dataclass
class Adaptive(BitWidths, MethodSettings):
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

    Tensors: keys and values (batch, kv_heads, tokens, head_dim).
    In a suite: `{name: adaptive, params: {base: turbo, base_params: {block: 64}, base_bits: 3,
    scale: 1.0}}`; benchmarks that calibrate (perplexity: its `calibration` tokens, after the
    scored ones) call calibrate().

    codec(), key_codec() and value_codec() are the base's at base_bits.
    """

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.core.wrappers",
        "mlx": "kvbench.methods.core.wrappers",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({"base_params": {"block": 16}},)

    base: str = param("turbo", meaning="the method each head is stored with; it needs an integer"
                      " `bits` field")
    base_params: dict[str, Any] = param(factory=dict,
                                        meaning="the base's parameters, without bits")
    base_bits: int = param(3, range=span(1, MAX_BITS),
                           meaning="the centre width; the base must accept it")
    scale: float = param(0.5, range=at_least(0), meaning="bits per standard deviation of"
                         " sensitivity (0 keeps every head at base_bits), upstream's"
                         " sensitivity_scale default")

    def check(self) -> None:
        if not math.isfinite(self.scale):
            raise SettingError("scale", f"scale must be a finite number >= 0, got {self.scale!r}")
        self.variants = bit_variants(self.base, self.base_params, range(1, MAX_BITS + 1))
        if self.base_bits not in self.variants:
            raise refused("base_bits", self.base_bits, self.base, self.variants, self.base_params)

    def policy_beyond_codec(self) -> list[str]:
        parts = self.variant(self.base_bits).policy_beyond_codec()
        if self.scale:
            parts = [*parts, "per-KV-head widths set by calibration (its codecs: base_bits)"]
        return parts
