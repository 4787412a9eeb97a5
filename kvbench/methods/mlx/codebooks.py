"""A reference Codebook's numbers as mx arrays: the same buckets and centroids on both backends."""
from __future__ import annotations

import mlx.core as mx


class MLXCodebook:
    """Codebook.quantize / dequantize on float32 mx arrays, from the reference codebook's numbers
    (kvbench.methods.torch.codebooks.Codebook).

    codebook: the reference (kept as .source). boundaries: float32 (2**bits - 1,), its
    float32_bounds; centroids: float32 (2**bits,).
    """

    def __init__(self, codebook):
        self.source = codebook
        self.bits = codebook.bits
        self.boundaries = mx.array(codebook.float32_bounds.numpy())
        self.centroids = mx.array(codebook.centroids.float().numpy())

    def quantize(self, x: mx.array) -> mx.array:
        """uint8 index of the nearest centroid of every element of x (cast to float32): the count
        of boundaries strictly below x, so an exact midpoint goes to the lower centroid, as
        torch's bucketize and comparison count."""
        return mx.searchsorted(self.boundaries, x.astype(mx.float32), side="left").astype(mx.uint8)

    def dequantize(self, idx: mx.array) -> mx.array:
        """The float32 centroid of every index."""
        return mx.take(self.centroids, idx.astype(mx.uint32))
