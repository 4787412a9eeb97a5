"""A torch Codebook's numbers as mx arrays: the same buckets and centroids on both backends."""
from __future__ import annotations

import math

import mlx.core as mx
import torch

from kvbench.methods.codebooks import Codebook


def float32_boundaries(codebook: Codebook) -> torch.Tensor:
    """The codebook's float64 boundaries rounded down to float32 where rounding went up: for
    float32 x, x <= b exactly when x <= this bound (Codebook.quantize's float32 path)."""
    bounds = codebook.boundaries.float()
    return torch.where(bounds.double() > codebook.boundaries,
                       torch.nextafter(bounds, torch.tensor(-math.inf)), bounds)


class MLXCodebook:
    """Codebook.quantize / dequantize on float32 mx arrays, from the torch codebook's numbers.

    codebook: the torch Codebook (kept as .source). boundaries: float32 (2**bits - 1,), see
    float32_boundaries; centroids: float32 (2**bits,).
    """

    def __init__(self, codebook: Codebook):
        self.source = codebook
        self.bits = codebook.bits
        self.boundaries = mx.array(float32_boundaries(codebook).numpy())
        self.centroids = mx.array(codebook.centroids.float().numpy())

    def quantize(self, x: mx.array) -> mx.array:
        """uint8 index of the nearest centroid of every element of x (cast to float32): the count
        of boundaries strictly below x, so an exact midpoint goes to the lower centroid, as
        torch's bucketize and comparison count."""
        return mx.searchsorted(self.boundaries, x.astype(mx.float32), side="left").astype(mx.uint8)

    def dequantize(self, idx: mx.array) -> mx.array:
        """The float32 centroid of every index."""
        return mx.take(self.centroids, idx.astype(mx.uint32))
