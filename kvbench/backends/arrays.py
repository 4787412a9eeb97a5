"""The array library a case measures on: torch (on its device) or MLX.

Benchmarks make their data in torch, hand it to the backend, run the method's implementation for
that backend, and bring results back to torch for the float64 arithmetic of their metrics, so a
metric means the same on both. Timers read the clock only after the work is done (a device sync
on torch, mx.eval of every array in the result on MLX).
"""
from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from kvbench.backends.torch_backend import timed as torch_timed
from kvbench.methods.base import Method, Packed


class ArrayBackend(Protocol):
    name: str

    def from_torch(self, tensor: torch.Tensor) -> Any: ...

    def to_torch(self, array: Any) -> torch.Tensor: ...

    def timed(self, fn) -> tuple[Any, float]: ...

    def copy(self, array: Any) -> Any:
        """A plain copy of the same bytes: the bandwidth reference."""

    def nbytes(self, array: Any) -> int: ...

    def implementation(self, method: Method) -> Any:
        """The method as this backend runs it (codec(), new_layer_cache(), ...)."""


class TorchArrays:
    name = "torch"

    def __init__(self, device: torch.device):
        self.device = device
        self._copy_to: torch.Tensor | None = None

    def from_torch(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device)

    def to_torch(self, array: torch.Tensor) -> torch.Tensor:
        return array.cpu()

    def timed(self, fn) -> tuple[Any, float]:
        return torch_timed(fn, self.device)

    def copy(self, array: torch.Tensor) -> torch.Tensor:
        # Into one buffer kept between calls: a fresh one would add first-touch page faults,
        # which made the reference swing 0.8-4.8 GB/s run to run here.
        out = self._copy_to
        if out is None or out.shape != array.shape or out.dtype != array.dtype:
            out = self._copy_to = torch.empty_like(array)
        return out.copy_(array)

    def nbytes(self, array: torch.Tensor) -> int:
        return array.numel() * array.element_size()

    def implementation(self, method: Method) -> Method:
        return method


class MLXArrays:
    name = "mlx"

    def __init__(self):
        import mlx.core as mx

        import kvbench.methods.mlx  # noqa: F401 - registers the MLX implementations

        self.mx = mx

    def from_torch(self, tensor: torch.Tensor):
        from kvbench.methods.mlx.base import to_mx

        return to_mx(tensor)

    def to_torch(self, array) -> torch.Tensor:
        from kvbench.methods.mlx.base import to_torch

        return to_torch(array)

    def timed(self, fn) -> tuple[Any, float]:
        from kvbench.backends.mlx_backend import synchronize

        synchronize()
        start = time.perf_counter()
        result = fn()
        # MLX is lazy: nothing has run until the arrays inside the result are evaluated
        synchronize(*[a for a in _arrays(result) if isinstance(a, self.mx.array)])
        return result, time.perf_counter() - start

    def copy(self, array):
        return self.mx.array(array)  # a new buffer (mx.contiguous of a contiguous array is free)

    def nbytes(self, array) -> int:
        return array.nbytes

    def implementation(self, method: Method):
        from kvbench.methods.mlx.base import on_mlx

        return on_mlx(method)


def _arrays(obj) -> list:
    """Every array inside a result: lists, tuples, dicts and Packed records are walked."""
    if isinstance(obj, Packed):
        return _arrays(list(obj.tensors.values()))
    if isinstance(obj, dict):
        return _arrays(list(obj.values()))
    if isinstance(obj, (list, tuple)):
        return [a for item in obj for a in _arrays(item)]
    return [] if obj is None else [obj]


def array_backend(name: str, device: torch.device) -> ArrayBackend:
    if name == "torch":
        return TorchArrays(device)
    if name == "mlx":
        return MLXArrays()
    raise ValueError(f"unknown backend {name!r}; use torch or mlx")
