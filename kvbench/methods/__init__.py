"""KV-cache methods: each a torch-free settings dataclass (kvbench.methods.settings) and its
implementations, registered against the settings: the torch reference (kvbench.methods.torch),
MLX (kvbench.methods.mlx), and what every backend shares (kvbench.methods.core).

implementation(settings, backend) builds a method as a backend runs it, importing first the
module its settings name for that backend (`implemented_in`); importing this package imports
no method (no torch, no MLX): names are looked up in METHODS's table when first used.
"""
from __future__ import annotations

from typing import Any

from kvbench.methods.core.contracts import Implementation
from kvbench.methods.settings import METHODS, Capabilities, MethodSettings, build_method
from kvbench.methods.settings.base import BACKENDS, registered_implementation


class OnBackend:
    """A backend as an implementation sees it (kvbench.methods.core.contracts.Backend)."""

    def __init__(self, name: str):
        from kvbench.backends import array_backend

        self.name = name
        self.arrays = array_backend(name)

    def implement(self, settings: MethodSettings) -> Implementation:
        return implementation(settings, self.name)


def has_implementation(settings_cls: type, backend: str) -> bool:
    """Whether `settings_cls` (exactly) has an implementation on `backend`; ImportError when the
    backend itself cannot be imported (MLX not installed)."""
    return registered_implementation(settings_cls, backend) is not None


def implementation(settings: MethodSettings, backend: str = "torch") -> Any:
    """The method `settings` configure, as `backend` ("torch" or "mlx") runs it."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    factory = registered_implementation(type(settings), backend)
    if factory is None:
        name = type(settings).name or type(settings).__name__
        raise NotImplementedError(
            f"method {name!r} has no {backend} implementation (register one for its exact"
            f" settings class with kvbench.methods.settings.implements)")
    return factory(settings, _backends.setdefault(backend, OnBackend(backend)))


_backends: dict[str, OnBackend] = {}

__all__ = ["METHODS", "Capabilities", "Implementation", "MethodSettings", "build_method",
           "has_implementation", "implementation"]
