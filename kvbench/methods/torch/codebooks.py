"""Lloyd-Max scalar codebooks: the MSE-optimal b-bit quantizer of one coordinate's density.

Lloyd (1957/1982), Max (1960): at the optimum every centroid is the conditional mean of its cell
and every boundary is the midpoint of its two centroids. Densities:

- "gaussian": N(0, 1); cell moments in closed form (erf / erfc and the pdf).
- "gaussian_d": N(0, 1/dim), the "gaussian" codebook scaled by 1/sqrt(dim).
- "beta": one coordinate of a uniformly random unit vector in dim dimensions,
  f(t) ∝ (1 - t^2)^((dim - 3) / 2) on [-1, 1]; cell moments integrated numerically in float64.

The solver runs Lloyd's iteration from a companding start and finishes with Newton steps on the
same fixed point: plain Lloyd needs ~N^2 iterations for N = 2^bits levels (~10^5 at 8 bits).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

DENSITIES = ("gaussian", "gaussian_d", "beta")

_F64 = torch.float64
_SQRT2 = math.sqrt(2.0)
_TOL = 1e-12  # on the Newton step, in units of the density's standard deviation
_NOISE = 1e-8  # steps below this that stop shrinking are rounding noise (same units)
_LLOYD_STEPS = 50  # plain Lloyd steps first, so that Newton starts near the fixed point
_MAX_NEWTON = 100
_COMPARE_UP_TO = 15  # boundaries (4 bits) counted by comparisons in quantize(); more: bucketize
_GRID = 4096  # panels of the beta integration grid in theta = asin(t)
_GL_NODES, _GL_WEIGHTS = (torch.from_numpy(a) for a in np.polynomial.legendre.leggauss(8))

# A moment function maps cell edges (lo, hi) to (mass, first, second moment) of each cell.
Moments = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
Pdf = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Codebook:
    """A solved b-bit scalar quantizer.

    centroids: float64 (2**bits,), ascending. boundaries: float64 (2**bits - 1,), the midpoints.
    mse: expected squared error under the density. density, bits, dim: what it was solved for.
    """

    centroids: torch.Tensor
    boundaries: torch.Tensor
    mse: float
    density: str
    bits: int
    dim: int | None

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 index of the nearest centroid for every element of x (any shape, float dtype);
        an exact midpoint goes to the lower centroid."""
        if x.dtype == torch.float64:
            return torch.bucketize(x, self.boundaries.to(x.device)).to(torch.uint8)
        bounds = self.float32_bounds
        x = x.float()
        if len(bounds) > _COMPARE_UP_TO:
            return torch.bucketize(x.contiguous(), bounds.to(x.device)).to(torch.uint8)
        # bucketize's index is the count of boundaries below x; a few vectorised comparisons
        # count them faster than its per-element binary search.
        idx = torch.gt(x, bounds[0].item()).to(torch.uint8)
        for bound in bounds[1:].tolist():
            idx += torch.gt(x, bound)
        return idx

    @functools.cached_property
    def float32_bounds(self) -> torch.Tensor:
        """The boundaries rounded down to float32: for float32 x, x <= b exactly when
        x <= (b rounded down), so counting these below x gives the float64 buckets without a
        float64 copy of x (what quantize and the kernels count)."""
        bounds = self.boundaries.float()
        return torch.where(bounds.double() > self.boundaries,
                           torch.nextafter(bounds, bounds.new_tensor(-math.inf)), bounds)

    def dequantize(self, idx: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The centroid of every index, as `dtype`."""
        # index_select takes int32 indices: a quarter of the int64 copy plain indexing needs
        table = self.centroids.to(idx.device, dtype if dtype == _F64 else torch.float32)
        return table.index_select(0, idx.reshape(-1).int()).view(idx.shape).to(dtype)


@functools.lru_cache(maxsize=None, typed=True)  # typed: bits=2.0 must not hit bits=2 and pass
def lloyd_max(density: str, bits: int, dim: int | None = None) -> Codebook:
    """The Lloyd-Max codebook of `density` ("gaussian", "gaussian_d", "beta") at `bits` (1..8);
    dim (>= 2) is required by gaussian_d and beta. Cached: one object per (density, bits, dim)."""
    if density not in DENSITIES:
        raise ValueError(f"density must be one of {DENSITIES}, got {density!r}")
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")
    if density == "gaussian":
        c, mse = _solve(gaussian_moments, _gaussian_pdf, math.inf, 1.0, bits)
        return _codebook(c, mse, density, bits, None)
    if not isinstance(dim, int) or dim < 2:
        raise ValueError(f"dim must be an int >= 2 for density {density!r}, got {dim!r}")
    if density == "gaussian_d":
        unit = lloyd_max("gaussian", bits)
        return _codebook(unit.centroids / math.sqrt(dim), unit.mse / dim, density, bits, dim)
    moments, pdf = _beta(dim)
    c, mse = _solve(moments, pdf, 1.0, 1 / math.sqrt(dim), bits)
    return _codebook(c, mse, density, bits, dim)


def _codebook(c: torch.Tensor, mse: float, density: str, bits: int, dim: int | None) -> Codebook:
    return Codebook(c, (c[1:] + c[:-1]) / 2, mse, density, bits, dim)


def _solve(
    moments: Moments, pdf: Pdf, edge: float, std: float, bits: int
) -> tuple[torch.Tensor, float]:
    """Centroids and MSE of the Lloyd-Max quantizer of a symmetric density on [-edge, edge]."""
    n = 1 << bits
    # Companding start (Panter-Dite): quantiles of N(0, 3 std^2), the density^(1/3) of a
    # Gaussian; a bounded support squashes them inside with tanh, keeping them distinct.
    p = (torch.arange(n, dtype=_F64) + 0.5) / n
    c = torch.special.ndtri(p) * math.sqrt(3) * std
    if math.isfinite(edge):
        c = edge * torch.tanh(c / edge)
    for _ in range(_LLOYD_STEPS):
        c = _lloyd_step(moments, c, edge)[0]
    previous = math.inf
    for _ in range(_MAX_NEWTON):
        new, jacobian = _lloyd_step(moments, c, edge, pdf)
        step = torch.linalg.solve(torch.eye(n, dtype=_F64) - jacobian, new - c)
        # A Newton step that breaks the ordering (far from the fixed point) falls back to Lloyd.
        if not bool(((c + step).diff() > 0).all()):
            c = new
            continue
        c = c + step
        # The Newton step estimates the distance to the fixed point (the Lloyd residual does
        # not: it is ~N^2 times smaller). Steps shrink quadratically until the rounding noise
        # of the integrals, amplified by that same ~N^2, stops them shrinking.
        size = float(step.abs().max()) / std
        if size <= _TOL or previous <= size <= _NOISE:
            break
        previous = size
    else:
        raise RuntimeError(f"Lloyd-Max did not converge for {bits} bits")
    lo, hi = _edges(c, edge)
    m0, m1, m2 = moments(lo, hi)
    return c, float((m2 - 2 * c * m1 + c * c * m0).sum())


def _edges(c: torch.Tensor, edge: float) -> tuple[torch.Tensor, torch.Tensor]:
    mid = (c[1:] + c[:-1]) / 2
    outer = torch.tensor([edge], dtype=_F64)
    return torch.cat([-outer, mid]), torch.cat([mid, outer])


def _lloyd_step(moments: Moments, c: torch.Tensor, edge: float, pdf: Pdf | None = None):
    """The Lloyd map T(c) (conditional means of the midpoint cells) and, given the pdf, its
    Jacobian dT/dc: d mean/d hi = pdf(hi) (hi - mean) / mass, d mean/d lo = pdf(lo) (mean - lo)
    / mass, and each inner edge moves by half of either neighbouring centroid's move."""
    lo, hi = _edges(c, edge)
    m0, m1, _ = moments(lo, hi)
    mean = m1 / m0
    if pdf is None:
        return mean, None
    d_hi = (pdf(hi) * (hi - mean) / m0)[:-1] / 2  # the outer edges are fixed
    d_lo = (pdf(lo) * (mean - lo) / m0)[1:] / 2
    zero = d_hi.new_zeros(1)
    diagonal = torch.cat([d_hi, zero]) + torch.cat([zero, d_lo])
    return mean, torch.diag(diagonal) + torch.diag(d_hi, 1) + torch.diag(d_lo, -1)


def _gaussian_pdf(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def gaussian_moments(lo: torch.Tensor, hi: torch.Tensor):
    """N(0, 1) mass, first and second moment of [lo, hi]: Phi(hi) - Phi(lo), pdf(lo) - pdf(hi),
    mass + lo pdf(lo) - hi pdf(hi). Tail cells use erfc so their small mass keeps its digits."""
    erfc = torch.special.erfc
    upper = (erfc(lo / _SQRT2) - erfc(hi / _SQRT2)) / 2
    lower = (erfc(-hi / _SQRT2) - erfc(-lo / _SQRT2)) / 2
    mass = torch.where(lo >= 0, upper, lower)
    p_lo, p_hi = _gaussian_pdf(lo), _gaussian_pdf(hi)
    return mass, p_lo - p_hi, mass + _x_pdf(lo, p_lo) - _x_pdf(hi, p_hi)


def _x_pdf(x: torch.Tensor, pdf: torch.Tensor) -> torch.Tensor:
    """x pdf(x), which tends to 0 at +-inf where the product itself is nan."""
    return torch.where(x.isinf(), 0.0, x * pdf)


def _beta(dim: int) -> tuple[Moments, Pdf]:
    """Moment function and pdf of f(t) ∝ (1 - t^2)^((dim - 3) / 2) on [-1, 1].

    With t = sin(theta) the moments are integrals of sin(theta)^k cos(theta)^(dim - 2) over
    [-pi/2, pi/2]: smooth and bounded even for dim = 2, where f itself is unbounded at +-1.
    8-point Gauss-Legendre on every panel of a fine grid gives cumulative sums from either end;
    a cell adds Gauss-Legendre over its partial panels, and cells in the upper half use the sums
    from the top so that the small mass of a tail cell keeps its digits.
    """
    def integrand(theta):
        w = torch.cos(theta).clamp_min(0) ** (dim - 2)
        s = torch.sin(theta)
        return torch.stack([w, s * w, s * s * w], dim=-1)

    def integral(a, b):  # (...) edges -> (..., 3)
        half = ((b - a) / 2)[..., None]
        x = ((a + b) / 2)[..., None] + half * _GL_NODES
        return half * (integrand(x) * _GL_WEIGHTS[:, None]).sum(-2)

    h = math.pi / _GRID
    grid = -math.pi / 2 + h * torch.arange(_GRID + 1, dtype=_F64)
    panels = integral(grid[:-1], grid[1:])
    zero = panels.new_zeros(1, 3)
    from_bottom = torch.cat([zero, panels.cumsum(0)])
    from_top = torch.cat([panels.flip(0).cumsum(0).flip(0), zero])
    total = float(from_bottom[-1, 0])

    def below(theta):  # integral over [-pi/2, theta]
        j = ((theta + math.pi / 2) / h).floor().long().clamp(0, _GRID - 1)
        return from_bottom[j] + integral(grid[j], theta)

    def above(theta):  # integral over [theta, pi/2]
        j = ((theta + math.pi / 2) / h).floor().long().clamp(0, _GRID - 1)
        return from_top[j + 1] + integral(theta, grid[j + 1])

    def moments(lo, hi):
        a, b = torch.asin(lo), torch.asin(hi)
        cell = torch.where((lo >= 0)[:, None], above(a) - above(b), below(b) - below(a)) / total
        return cell.unbind(-1)

    def pdf(t):
        return (1 - t * t).clamp_min(0) ** ((dim - 3) / 2) / total

    return moments, pdf
