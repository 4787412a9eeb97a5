"""Seeded random rotations applied along the last dim: the fast Walsh-Hadamard transform with
random signs (TurboQuant / PolarQuant, arXiv 2504.19874, and its TurboQuant+ ports) and a dense
Haar-random orthogonal matrix.

Rotation seeds are drawn from each rotation's own torch.Generator, never from the global RNG, so
they stay independent of the seeds that make data.
"""
from __future__ import annotations

import math

import torch


def _check_power_of_two(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {n}")


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform along the last dim: H x / sqrt(n).

    H is the Sylvester (natural-order) Hadamard matrix, symmetric, so fwht is its own inverse.
    One vectorised butterfly per level, log2(n) levels: O(n log n) per row.
    x: (..., n) floating point, n a power of two. Returns the same shape and dtype.
    """
    n = x.shape[-1]
    _check_power_of_two(n)
    lead = x.shape[:-1]
    # Levels ping-pong between two contiguous buffers; x itself is never written.
    buffers = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for _ in range(2)]
    h, level = 1, 0
    while h < n:
        src = x.reshape(*lead, n // (2 * h), 2, h)
        dst = buffers[level % 2].view(*lead, n // (2 * h), 2, h)
        torch.add(src[..., 0, :], src[..., 1, :], out=dst[..., 0, :])
        torch.sub(src[..., 0, :], src[..., 1, :], out=dst[..., 1, :])
        x = buffers[level % 2]
        h, level = 2 * h, level + 1
    return x / math.sqrt(n)


def _signs(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=generator, device="cpu").double() * 2 - 1


class _MatrixRotation:
    """forward(u) = R u and inverse(y) = R^T y along the last dim of (..., dim) tensors, as one
    matrix product each: on a CPU a 128 x 128 product runs faster than log2(128) butterfly
    passes over memory. matrix: R, float64 (dim, dim)."""

    matrix: torch.Tensor

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u @ self.matrix.T.to(u.device, u.dtype)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y @ self.matrix.to(y.device, y.dtype)


class SignedHadamard(_MatrixRotation):
    """R = (1/sqrt(n)) D2 H D1: H the Walsh-Hadamard matrix, D1 and D2 diagonal +-1 signs.

    The signs come from torch.Generator().manual_seed(seed), D1 drawn before D2. R is built once
    with fwht (float64) and applied as a matrix.
    dim: int, a power of two. forward(u) = R u and inverse(y) = R^T y, both along the last dim
    of (..., dim) tensors.
    """

    def __init__(self, dim: int, seed: int = 0):
        _check_power_of_two(dim)
        self.dim, self.seed = dim, seed
        generator = torch.Generator().manual_seed(seed)
        self.d1 = _signs(dim, generator)
        self.d2 = _signs(dim, generator)
        # Row i of fwht(diag(d1)) * d2 is R e_i, so that product is R^T.
        self.matrix = (fwht(torch.diag(self.d1)) * self.d2).T.contiguous()


class HaarRotation(_MatrixRotation):
    """A uniformly (Haar) random orthogonal matrix Q: QR of a seeded standard Gaussian matrix,
    with each column of Q multiplied by the sign of R's diagonal (without that fix QR's sign
    convention makes the distribution non-uniform).

    The Gaussian comes from torch.Generator().manual_seed(seed), in float64.
    dim: int >= 1. forward(u) = Q u and inverse(y) = Q^T y along the last dim of (..., dim).
    """

    def __init__(self, dim: int, seed: int = 0):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim, self.seed = dim, seed
        gaussian = torch.randn(
            dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64,
            device="cpu")
        q, r = torch.linalg.qr(gaussian)
        self.matrix = q * torch.sign(torch.diagonal(r))


ROTATIONS = {"hadamard": SignedHadamard, "haar": HaarRotation}


def make_rotation(kind: str, dim: int, seed: int = 0) -> SignedHadamard | HaarRotation:
    """The rotation named `kind` ("hadamard" or "haar") of size dim, seeded with seed."""
    if kind not in ROTATIONS:
        raise ValueError(f"rotation must be one of {sorted(ROTATIONS)}, got {kind!r}")
    return ROTATIONS[kind](dim, seed)
