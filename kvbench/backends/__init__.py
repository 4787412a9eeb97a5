"""Where torch and MLX part: devices and dtypes (devices.py), each library's runtime
(torch_backend.py, mlx_backend.py) and arrays (arrays.py, the face; torch_arrays.py,
mlx_arrays.py)."""
from __future__ import annotations

from typing import Any

from kvbench.backends.arrays import Arrays


def array_backend(name: str, device: Any = None) -> Arrays:
    """The arrays of backend `name` ("torch", on `device`, or "mlx")."""
    if name == "torch":
        from kvbench.backends.torch_arrays import TorchArrays

        return TorchArrays(device)
    if name == "mlx":
        from kvbench.backends.mlx_arrays import MLXArrays

        return MLXArrays()
    raise ValueError(f"unknown backend {name!r}; use torch or mlx")
