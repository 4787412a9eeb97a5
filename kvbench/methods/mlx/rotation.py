"""A torch rotation's matrix as an mx array: forward R u and inverse R^T y along the last dim."""
from __future__ import annotations

import mlx.core as mx

from kvbench.methods.rotation import HaarRotation, SignedHadamard


class MLXRotation:
    """forward(u) = u @ R^T and inverse(y) = y @ R in float32, with R the torch rotation's float64
    matrix rounded to float32, as kvbench.methods.rotation._MatrixRotation does for float32 input.
    rotation: the torch SignedHadamard or HaarRotation (kept as .source)."""

    def __init__(self, rotation: SignedHadamard | HaarRotation):
        self.source = rotation
        self.dim = rotation.dim
        self.matrix = mx.array(rotation.matrix.float().numpy())
        self.matrix_t = mx.array(rotation.matrix.float().T.contiguous().numpy())

    def forward(self, u: mx.array) -> mx.array:
        return u @ self.matrix_t

    def inverse(self, y: mx.array) -> mx.array:
        return y @ self.matrix
