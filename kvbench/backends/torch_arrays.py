"""kvbench.backends.arrays.Arrays on torch tensors (on a device, for benchmarks' transfers)."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from kvbench.backends.arrays import Arrays
from kvbench.backends.torch_backend import timed


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def storage_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the distinct storages behind `tensors`: what is really held, views included."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class TorchArrays(Arrays):
    name = "torch"
    float32, uint8, bool_ = torch.float32, torch.uint8, torch.bool

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self._copy_to: torch.Tensor | None = None
        self._indices: dict[tuple, torch.Tensor] = {}

    def concat(self, arrays: list[torch.Tensor], axis: int = -2) -> torch.Tensor:
        return torch.cat(arrays, dim=axis)

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def with_room(self, x: torch.Tensor, axis: int, capacity: int) -> torch.Tensor | None:
        # on CUDA too: the fused reads (CPU and Triton) read views of the filled part in place
        shape = list(x.shape)
        shape[axis] = capacity
        held = x.new_empty(shape)
        held.narrow(axis, 0, x.shape[axis]).copy_(x)
        return held

    def write(self, into: torch.Tensor, at: int, x: torch.Tensor, axis: int) -> None:
        # a buffer made under inference mode (a session's forwards) is written in it, whoever
        # writes (torch refuses an in-place update of an inference tensor outside it)
        with torch.inference_mode(into.is_inference()):
            into.narrow(axis, at, x.shape[axis]).copy_(x)

    def cast(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    def where(self, condition: torch.Tensor, x: Any, y: Any) -> torch.Tensor:
        return torch.where(condition, x, y)

    def take(self, x: torch.Tensor, indices: Sequence[int], axis: int) -> torch.Tensor:
        key = (tuple(indices), x.device)
        if key not in self._indices:
            self._indices[key] = torch.tensor(list(indices), device=x.device)
        return x.index_select(axis, self._indices[key])

    def zeros(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(shape)

    def repeat(self, x: torch.Tensor, repeats: int, axis: int) -> torch.Tensor:
        return x.repeat_interleave(repeats, dim=axis)

    def broadcast_to(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return x.expand(*shape)

    def tanh(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    def softmax(self, x: torch.Tensor, axis: int = -1) -> torch.Tensor:
        return torch.softmax(x, dim=axis)

    def maximum(self, x: torch.Tensor, floor: float) -> torch.Tensor:
        return x.clamp_min(floor)

    def causal_mask(self, queries: int, keys: int, like: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(queries, keys, dtype=torch.bool, device=like.device)
        return ones.tril(keys - queries)

    def nbytes(self, *arrays: torch.Tensor | None) -> int:
        return tensor_bytes(*arrays)

    def held_bytes(self, *arrays: torch.Tensor | None) -> int:
        return storage_bytes(*arrays)

    def itemsize(self, x: torch.Tensor) -> int:
        return x.element_size()

    def from_torch(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device)

    def to_torch(self, array: torch.Tensor) -> torch.Tensor:
        return array.cpu()

    def timed(self, fn) -> tuple[Any, float]:
        return timed(fn, self.device)

    def reference_copy(self, array: torch.Tensor) -> torch.Tensor:
        # Into one buffer kept between calls: a fresh one would add first-touch page faults,
        # which made the reference swing 0.8-4.8 GB/s run to run here.
        out = self._copy_to
        if out is None or out.shape != array.shape or out.dtype != array.dtype:
            out = self._copy_to = torch.empty_like(array)
        return out.copy_(array)


TORCH_ARRAYS = TorchArrays()  # what caches use: no device of their own (they follow the keys')
