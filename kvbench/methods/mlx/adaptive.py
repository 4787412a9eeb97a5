"""`adaptive` on MLX: per-(layer, KV head) widths over a method with a `bits` field
(kvbench.methods.adaptive).

The per-head storage is torch's AdaptiveCache run on mx.array: MLXAdaptiveCache overrides only
how a group's heads are taken out of a step (_select) and put back (_place), and gives each
width's heads to the base's MLX cache at that width (on_mlx of the base built at that width).
The widths themselves live on the torch config (config.head_bits), so both backends store every
head at the same width; calibrating sets them from the statistics the benchmark hands over
(kvbench.models.mlx_session measures attention entropy on the MLX model itself).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from kvbench.methods.adaptive import Adaptive, AdaptiveCache
from kvbench.methods.base import Codec
from kvbench.methods.mlx.base import MLXMethod, mlx_implementation, on_mlx


class MLXAdaptiveCache(AdaptiveCache):
    """AdaptiveCache on mx.array: `variants` are the base's MLX methods at each width. A group's
    heads are gathered with mx.take (a copy: a group never holds the whole step's buffer), and
    attention_inputs concatenates the groups along heads and takes them back with the inverse
    permutation (exact: values are moved, never computed)."""

    def _select(self, x: mx.array, group: int, per_head: int = 1) -> mx.array:
        key = (group, per_head)
        if key not in self._index:
            heads = [h * per_head + j for h in self.groups[group].heads for j in range(per_head)]
            self._index[key] = mx.array(heads, dtype=mx.int32)
        return mx.take(x, self._index[key], axis=1)

    def _place(self, parts):
        order = [h for group in self.groups for h in group.heads]
        inverse = mx.array(np.argsort(np.array(order), kind="stable").astype(np.int32))
        keys = mx.take(mx.concatenate([k for k, _, _ in parts], axis=1), inverse, axis=1)
        values = mx.take(mx.concatenate([v for _, v, _ in parts], axis=1), inverse, axis=1)
        bias = None
        if any(b is not None for _, _, b in parts):
            dtype = parts[0][0].dtype
            biases = [b if b is not None else mx.zeros((k.shape[0], k.shape[1], k.shape[-2]), dtype)
                      for k, _, b in parts]
            bias = mx.take(mx.concatenate(biases, axis=1), inverse, axis=1)
        return keys, values, bias


@mlx_implementation(Adaptive)
class MLXAdaptive(MLXMethod):
    """Adaptive on MLX; config: kvbench.methods.adaptive.Adaptive (base, base_params, base_bits,
    scale), with the per-head widths it holds after calibrate() (config.head_bits, or every head
    at base_bits before). Each width's heads are stored by the MLX cache of config.variant(bits).
    """

    def __init__(self, config: Adaptive):
        super().__init__(config)
        self.variants = {bits: on_mlx(config.variant(bits)) for bits in config.widths()}

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        """Adaptive.calibrate on the torch config, so that both backends use the same widths;
        `stats` carry the entropy the MLX session measured on the MLX model."""
        self.config.calibrate(stats, tokens)

    def new_layer_cache(self, layer_idx: int) -> MLXAdaptiveCache:
        c = self.config
        return MLXAdaptiveCache(self.variants, c.bits_per_head(layer_idx), c.base_bits, layer_idx)

    def codec(self) -> Codec | None:
        return self.variants[self.config.base_bits].codec()

    def key_codec(self) -> Codec | None:
        return self.variants[self.config.base_bits].key_codec()

    def value_codec(self) -> Codec | None:
        return self.variants[self.config.base_bits].value_codec()
