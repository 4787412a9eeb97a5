"""Seeded inputs and codec round trips shared by the method tests (plain functions: import them)."""
from __future__ import annotations

import torch


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values drawn in float32 from a generator seeded with `seed`, then cast to
    `dtype`: the same draw whatever the dtype, to its precision."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def token_ids(n: int, seed: int = 3) -> torch.Tensor:
    """(1, n) token ids below 256 (the tiny models' vocabulary), from a seeded generator."""
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def round_trip(method, x: torch.Tensor) -> torch.Tensor:
    """x encoded and decoded by the method's codec (`method`: a method's settings, run as their
    torch implementation, or an implementation)."""
    from kvbench.methods import implementation
    from kvbench.methods.settings.base import MethodSettings

    if isinstance(method, MethodSettings):
        method = implementation(method)
    codec = method.codec()
    return codec.decode(codec.encode(x))
