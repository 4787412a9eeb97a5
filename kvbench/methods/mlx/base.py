"""Methods on MLX: the same Codec and LayerCachePolicy contracts (kvbench.methods.base) on mx.array.

Each MLX implementation is a class registered for a torch Method class with @mlx_implementation;
it is built from that method's config (the dataclass a suite made) and offers what a benchmark
needs: codec(), key_codec(), value_codec(), new_layer_cache(layer_idx), calibrate(). The torch
method is the reference; tests/test_mlx_parity.py checks each implementation against it.
"""
from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
import numpy as np
import torch

from kvbench.methods.base import Codec, HasCodecs, LayerCachePolicy, Method, Packed
from kvbench.methods.codec_cache import CodecCache

_IMPLEMENTATIONS: dict[type, type] = {}


def mlx_implementation(*method_classes: type[Method]) -> Callable[[type], type]:
    """Register the decorated class as the MLX implementation of exactly `method_classes`: a
    subclass (a plug-in overriding the algorithm) has none until it registers its own, so it
    never silently runs its parent's."""
    def register(cls: type) -> type:
        for method_cls in method_classes:
            _IMPLEMENTATIONS[method_cls] = cls
        return cls
    return register


def has_mlx(method_cls: type[Method]) -> bool:
    return method_cls in _IMPLEMENTATIONS


def on_mlx(method: Method) -> "MLXMethod":
    """`method` as MLX runs it."""
    implementation = _IMPLEMENTATIONS.get(type(method))
    if implementation is None:
        raise NotImplementedError(f"method {type(method).name or type(method).__name__!r} has"
                                  " no MLX implementation (registered for its exact class)")
    return implementation(method)


class MLXMethod(HasCodecs):
    """Base of MLX implementations: `config` is the torch Method whose fields configure it."""

    def __init__(self, config: Method):
        self.config = config

    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        raise NotImplementedError

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        """As Method.calibrate, with statistics measured on the MLX-hosted model."""

    def layout(self) -> str:
        return self.config.layout()


def to_mx(tensor: torch.Tensor) -> mx.array:
    """A torch tensor as an mx.array of the same dtype (a copy)."""
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        return mx.array(tensor.float().cpu().numpy()).astype(mx.bfloat16)
    return mx.array(tensor.cpu().numpy())


def to_torch(array: mx.array) -> torch.Tensor:
    """An mx.array as a CPU torch tensor of the same dtype (a copy)."""
    if array.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(array.astype(mx.float32))).bfloat16()
    return torch.from_numpy(np.array(array))


def array_bytes(*arrays: mx.array | None) -> int:
    return sum(a.nbytes for a in arrays if a is not None)


class MLXCodec(Codec):
    """A Codec whose Packed holds mx.array tensors (and an mx dtype)."""

    def nbytes(self, packed: Packed) -> int:
        return array_bytes(*packed.tensors.values())


class MLXOps:
    """kvbench.methods.array_ops.TorchOps on mx.array. copy: mx.contiguous of a slice is a new
    buffer (an MLX slice would keep the whole buffer it was cut from alive). Arrays count at their
    own size for both accounted and measured bytes."""

    @staticmethod
    def concat(arrays: list[mx.array]) -> mx.array:
        return mx.concatenate(arrays, axis=-2)

    @staticmethod
    def copy(x: mx.array) -> mx.array:
        return mx.contiguous(x)

    @staticmethod
    def cast(x: mx.array, dtype) -> mx.array:
        return x.astype(dtype)

    @staticmethod
    def nbytes(*arrays: mx.array | None) -> int:
        return array_bytes(*arrays)

    @staticmethod
    def held_bytes(*arrays: mx.array | None) -> int:
        return array_bytes(*arrays)


MLX_OPS = MLXOps()


class MLXCodecCache(CodecCache):
    """kvbench.methods.codec_cache.CodecCache on mx.array."""

    ops = MLX_OPS
