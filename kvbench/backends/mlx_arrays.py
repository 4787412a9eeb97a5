"""kvbench.backends.arrays.Arrays on mx.array. copy: mx.contiguous of a slice is a new buffer (an
MLX slice would keep the whole buffer it was cut from alive). Arrays count at their own size for
both accounted and measured bytes. Torch is needed only to cross over (from_torch, to_torch)."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from kvbench.backends.arrays import Arrays
from kvbench.backends.mlx_backend import synchronize


def array_bytes(*arrays: mx.array | None) -> int:
    return sum(a.nbytes for a in arrays if a is not None)


def to_mx(tensor) -> mx.array:
    """A torch tensor as an mx.array of the same dtype (a copy)."""
    if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16
        return mx.array(tensor.float().cpu().numpy()).astype(mx.bfloat16)
    return mx.array(tensor.cpu().numpy())


def to_torch(array: mx.array):
    """An mx.array as a CPU torch tensor of the same dtype (a copy)."""
    import torch

    if array.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(array.astype(mx.float32))).bfloat16()
    return torch.from_numpy(np.array(array))


def arrays_in(obj: Any) -> list:
    """Every array inside a result: lists, tuples, dicts and dataclasses (a codec's Packed) are
    walked; whatever else is there is taken for an array."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return arrays_in([getattr(obj, f.name) for f in dataclasses.fields(obj)])
    if isinstance(obj, dict):
        return arrays_in(list(obj.values()))
    if isinstance(obj, (list, tuple)):
        return [a for item in obj for a in arrays_in(item)]
    return [] if obj is None else [obj]


class MLXArrays(Arrays):
    name = "mlx"
    device = "cpu"  # torch data for MLX is made on the CPU
    float32, uint8, bool_ = mx.float32, mx.uint8, mx.bool_

    def concat(self, arrays: list[mx.array], axis: int = -2) -> mx.array:
        return mx.concatenate(arrays, axis=axis)

    def copy(self, x: mx.array) -> mx.array:
        return mx.contiguous(x)

    def with_room(self, x: mx.array, axis: int, capacity: int) -> None:
        return None  # mx.arrays are not written in place

    def write(self, into: mx.array, at: int, x: mx.array, axis: int) -> None:
        raise NotImplementedError("mx.arrays are not written in place: with_room gives none")

    def cast(self, x: mx.array, dtype) -> mx.array:
        return x.astype(dtype)

    def where(self, condition: mx.array, x: Any, y: Any) -> mx.array:
        return mx.where(condition, x, y)

    def take(self, x: mx.array, indices: Sequence[int], axis: int) -> mx.array:
        return mx.take(x, mx.array(list(indices), dtype=mx.int32), axis=axis)

    def zeros(self, shape: tuple[int, ...], like: mx.array) -> mx.array:
        return mx.zeros(shape, like.dtype)

    def repeat(self, x: mx.array, repeats: int, axis: int) -> mx.array:
        return mx.repeat(x, repeats, axis=axis)

    def broadcast_to(self, x: mx.array, shape: tuple[int, ...]) -> mx.array:
        return mx.broadcast_to(x, shape)

    def tanh(self, x: mx.array) -> mx.array:
        return mx.tanh(x)

    def softmax(self, x: mx.array, axis: int = -1) -> mx.array:
        return mx.softmax(x, axis=axis, precise=True)

    def maximum(self, x: mx.array, floor: float) -> mx.array:
        return mx.maximum(x, floor)

    def causal_mask(self, queries: int, keys: int, like: mx.array) -> mx.array:
        return mx.arange(keys - queries, keys)[:, None] >= mx.arange(keys)[None]

    def nbytes(self, *arrays: mx.array | None) -> int:
        return array_bytes(*arrays)

    def held_bytes(self, *arrays: mx.array | None) -> int:
        return array_bytes(*arrays)

    def itemsize(self, x: mx.array) -> int:
        return x.itemsize

    def from_torch(self, tensor) -> mx.array:
        return to_mx(tensor)

    def to_torch(self, array: mx.array):
        return to_torch(array)

    def timed(self, fn) -> tuple[Any, float]:
        synchronize()
        start = time.perf_counter()
        result = fn()
        # MLX is lazy: nothing has run until the arrays inside the result are evaluated
        synchronize(*[a for a in arrays_in(result) if isinstance(a, mx.array)])
        return result, time.perf_counter() - start

    def reference_copy(self, array: mx.array) -> mx.array:
        return mx.array(array)  # a new buffer (mx.contiguous of a contiguous array is free)


MLX_ARRAYS = MLXArrays()
