"""Seeded synthetic vectors for the proofs benchmark: float32 tensors (n, d), on the CPU.

Vectors, outlier channel choices and queries draw from separate random streams, so one seed
never makes the queries a copy of the vectors.
"""
from __future__ import annotations

import numpy as np
import torch

_VECTORS, _CHANNELS, _QUERIES = 0, 1, 2  # stream ids


def _generator(seed: int, stream: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, stream]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def gaussian(n: int, d: int, seed: int) -> torch.Tensor:
    """N(0, 1) in every coordinate."""
    return torch.randn(n, d, generator=_generator(seed, _VECTORS))


def sphere(n: int, d: int, seed: int) -> torch.Tensor:
    """Uniform on the unit sphere (normalised Gaussians)."""
    x = gaussian(n, d, seed)
    return x / x.norm(dim=-1, keepdim=True)


def outliers(n: int, d: int, seed: int, channels: int = 4, factor: float = 20.0) -> torch.Tensor:
    """Gaussian with `channels` seeded random channels scaled by `factor`, like real keys."""
    x = gaussian(n, d, seed)
    picked = torch.randperm(d, generator=_generator(seed, _CHANNELS))[:channels]
    x[:, picked] *= factor
    return x


KINDS = {"gaussian": gaussian, "sphere": sphere, "outliers": outliers}


def make_vectors(kind: str, n: int, d: int, seed: int) -> torch.Tensor:
    """n vectors of dimension d drawn from `kind` (one of KINDS), float32 (n, d)."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic data kind {kind!r}; choose one of {sorted(KINDS)}")
    return KINDS[kind](n, d, seed)


def make_queries(n: int, d: int, seed: int) -> torch.Tensor:
    """n N(0, 1) query vectors of dimension d, float32 (n, d); callers scale them to the keys."""
    return torch.randn(n, d, generator=_generator(seed, _QUERIES))
