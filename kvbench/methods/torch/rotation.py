"""Seeded random rotations applied along the last dim: the fast Walsh-Hadamard transform with
random signs (TurboQuant / PolarQuant, arXiv 2504.19874, and its TurboQuant+ ports) and a dense
Haar-random orthogonal matrix.

Rotation seeds are drawn from each rotation's own torch.Generator, never from the global RNG, so
they stay independent of the seeds that make data.
"""
from __future__ import annotations

import math

import torch

from kvbench.methods.torch.rounding import divide


def _check_power_of_two(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {n}")


@torch.no_grad()  # its levels write into buffers; what codecs rotate, they quantize
def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform along the last dim: H x / sqrt(n).

    H is the Sylvester (natural-order) Hadamard matrix, symmetric, so fwht is its own inverse.
    One vectorised butterfly per level, log2(n) levels: O(n log n) per row.
    x: (..., n) floating point, n a power of two. Returns the same shape and dtype, without a
    gradient.
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
    return divide(x, math.sqrt(n))


def _signs(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=generator, device="cpu").double() * 2 - 1


class SignedHadamard:
    """R = (1/sqrt(n)) D2 H D1: H the Walsh-Hadamard matrix, D1 and D2 diagonal +-1 signs.

    The signs come from torch.Generator().manual_seed(seed), D1 drawn before D2.
    dim: int, a power of two. forward(u) = R u = d2 * fwht(d1 * u) and inverse(y) = R^T y =
    d1 * fwht(d2 * y), both along the last dim of (..., dim) tensors: butterflies in fwht's
    fixed order (sign flips are exact), so the Triton kernels, which run the same butterflies,
    round every coordinate the same way. As fast on a CPU as the product by R (measured at
    8192 x 128, float32). `matrix` is R (float64), for backends that apply it as a product.
    """

    def __init__(self, dim: int, seed: int = 0):
        _check_power_of_two(dim)
        self.dim, self.seed = dim, seed
        generator = torch.Generator().manual_seed(seed)
        self.d1 = _signs(dim, generator)
        self.d2 = _signs(dim, generator)
        # Row i of fwht(diag(d1)) * d2 is R e_i, so that product is R^T.
        self.matrix = (fwht(torch.diag(self.d1)) * self.d2).T.contiguous()
        self._signs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def signs(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(d1, d2) in like's dtype, on its device; made once, as plain tensors even inside
        inference_mode (an inference tensor kept here would break a later autograd pass)."""
        key = (like.device, like.dtype)
        if key not in self._signs:
            with torch.inference_mode(False):
                self._signs[key] = (self.d1.to(like.device, like.dtype),
                                    self.d2.to(like.device, like.dtype))
        return self._signs[key]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        d1, d2 = self.signs(u)
        return fwht(u * d1) * d2

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        d1, d2 = self.signs(y)
        return fwht(y * d2) * d1


class HaarRotation:
    """A uniformly (Haar) random orthogonal matrix Q: QR of a seeded standard Gaussian matrix,
    with each column of Q multiplied by the sign of R's diagonal (without that fix QR's sign
    convention makes the distribution non-uniform).

    The Gaussian comes from torch.Generator().manual_seed(seed), in float64.
    dim: int >= 1. forward(u) = Q u and inverse(y) = Q^T y along the last dim of (..., dim),
    one matrix product each (whose rounding depends on the BLAS kernel: no Triton kernel
    reproduces it bit for bit, so codecs with this rotation have none).
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

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u @ self.matrix.T.to(u.device, u.dtype)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y @ self.matrix.to(y.device, y.dtype)


ROTATIONS = {"hadamard": SignedHadamard, "haar": HaarRotation}


def make_rotation(kind: str, dim: int, seed: int = 0) -> SignedHadamard | HaarRotation:
    """The rotation named `kind` ("hadamard" or "haar") of size dim, seeded with seed."""
    if kind not in ROTATIONS:
        raise ValueError(f"rotation must be one of {sorted(ROTATIONS)}, got {kind!r}")
    return ROTATIONS[kind](dim, seed)
