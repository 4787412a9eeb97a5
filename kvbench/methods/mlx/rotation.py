"""A reference rotation's matrix as an mx array: forward R u and inverse R^T y along the last
dim."""
from __future__ import annotations

import mlx.core as mx


class MLXRotation:
    """forward(u) = u @ R^T and inverse(y) = y @ R in float32, with R the torch rotation's float64
    matrix rounded to float32, as the reference's matrix product does for float32 input.
    rotation: the reference SignedHadamard or HaarRotation (kept as .source)."""

    def __init__(self, rotation):
        self.source = rotation
        self.dim = rotation.dim
        self.matrix = mx.array(rotation.matrix.float().numpy())
        self.matrix_t = mx.array(rotation.matrix.float().T.contiguous().numpy())

    def forward(self, u: mx.array) -> mx.array:
        return u @ self.matrix_t

    def inverse(self, y: mx.array) -> mx.array:
        return y @ self.matrix
