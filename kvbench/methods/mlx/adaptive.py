"""`adaptive` on MLX: per-(layer, KV head) widths over a method with a `bits` field
(kvbench.methods.adaptive).

The per-head storage is torch's AdaptiveCache run on mx.array: MLXAdaptiveCache overrides only
how a group's heads are taken out of a step (_select) and put back (_place), and gives each
width's heads to the base's MLX cache at that width (on_mlx of the base built at that width).
The widths themselves live on the torch config (config.head_bits), so both backends store every
head at the same width.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import torch

from kvbench.methods.adaptive import MIN_CALIBRATION_TOKENS, Adaptive, AdaptiveCache
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


def torch_model_for(model: Any) -> Any:
    """The torch model to calibrate with: `model` itself when it is one (a transformers model or
    a torch LoadedModel), else kvbench.models.load_model(model.spec, cpu), the torch model of
    the spec an MLX-hosted model (kvbench.models.mlx_host.MLXLoaded) was loaded from."""
    if isinstance(model, torch.nn.Module) or isinstance(getattr(model, "model", None),
                                                        torch.nn.Module):
        return model
    spec = getattr(model, "spec", None)
    if not isinstance(spec, str):
        raise TypeError(f"adaptive calibration on MLX needs the model's spec (a `.spec`), got"
                        f" {type(model).__name__}")
    from kvbench.models import load_model

    return load_model(spec, torch.device("cpu"))


@mlx_implementation(Adaptive)
class MLXAdaptive(MLXMethod):
    """Adaptive on MLX; config: kvbench.methods.adaptive.Adaptive (base, base_params, base_bits,
    scale), with the per-head widths it holds after calibrate() (config.head_bits, or every head
    at base_bits before). Each width's heads are stored by the MLX cache of config.variant(bits).
    """

    def __init__(self, config: Adaptive):
        super().__init__(config)
        self.variants = {bits: on_mlx(config.variant(bits)) for bits in config.widths()}

    def calibrate(self, model: Any, tokens: list[int]) -> None:
        """Sets every head's width from attention entropy on `tokens`, on the torch config, so
        that both backends use the same widths.

        The entropy measurement is a model analysis, not a cache operation: it runs torch's
        calibration (Adaptive.calibrate: one eager-attention forward pass) on the torch model of
        the same spec, kvbench.models.load_model(model.spec, torch.device("cpu")), where
        `model` is the MLX-hosted model (it has a `.spec`); a torch model given here is used as
        it is. The torch model is loaded for the pass and dropped after it.
        """
        if len(tokens) < MIN_CALIBRATION_TOKENS:  # before loading a model for nothing
            raise ValueError(f"adaptive calibration needs at least {MIN_CALIBRATION_TOKENS}"
                             f" tokens, got {len(tokens)}")
        self.config.calibrate(torch_model_for(model), tokens)

    def new_layer_cache(self, layer_idx: int) -> MLXAdaptiveCache:
        c = self.config
        return MLXAdaptiveCache(self.variants, c.bits_per_head(layer_idx), c.base_bits, layer_idx)

    def codec(self) -> Codec | None:
        return self.variants[self.config.base_bits].codec()

    def key_codec(self) -> Codec | None:
        return self.variants[self.config.base_bits].key_codec()

    def value_codec(self) -> Codec | None:
        return self.variants[self.config.base_bits].value_codec()
