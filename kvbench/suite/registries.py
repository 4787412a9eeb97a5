"""Where a suite's method and benchmark names are looked up: the registries, or, where torch is
not installed, stand-ins for the built-in ones made from kvbench/catalog.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbench.registry import Registry


@dataclass(frozen=True)
class Registries:
    methods: Registry
    benchmarks: Registry
    # () -> has_mlx(method class) -> bool; raises ImportError where MLX cannot be used
    mlx_support: Callable[[], Callable[[type], bool]]
    note: str = ""  # what a suite checked against these is not checked for


def registries() -> Registries:
    """The real registries; without torch, the catalog's stand-ins (same names, parameters,
    parameter types and metrics, none of the code behind them)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        from kvbench.catalog import catalog_registries

        return catalog_registries()
    from kvbench.benchmarks import BENCHMARKS
    from kvbench.methods import METHODS

    return Registries(METHODS, BENCHMARKS, _mlx_support)


def _mlx_support() -> Callable[[type], bool]:
    import kvbench.methods.mlx  # noqa: F401 - registers the MLX implementations
    from kvbench.methods.mlx.base import has_mlx

    return has_mlx
