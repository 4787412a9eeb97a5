"""The few array operations a cache policy performs on what it holds, per array library.

Cache policies (CodecCache, KiviCache, DecayCache) are written once against `ops`; their MLX
twins are the same classes with `ops = MLX_OPS` (kvbench.methods.mlx.base), so both backends
pack, keep and count the same tokens by the same code.
"""
from __future__ import annotations

import torch

from kvbench.methods.base import storage_bytes, tensor_bytes


class TorchOps:
    @staticmethod
    def concat(arrays: list[torch.Tensor]) -> torch.Tensor:
        """Join along tokens (axis -2)."""
        return torch.cat(arrays, dim=-2)

    @staticmethod
    def copy(x: torch.Tensor) -> torch.Tensor:
        """A copy, so a kept slice does not pin the storage it was cut from."""
        return x.clone()

    @staticmethod
    def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    @staticmethod
    def nbytes(*arrays: torch.Tensor | None) -> int:
        """Accounted bytes: each array at its own size."""
        return tensor_bytes(*arrays)

    @staticmethod
    def held_bytes(*arrays: torch.Tensor | None) -> int:
        """Measured bytes: the storages really held, views included."""
        return storage_bytes(*arrays)


TORCH_OPS = TorchOps()
