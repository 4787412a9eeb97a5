"""`lloydmax` on MLX: per-vector float32 norm plus N(0, 1) Lloyd-Max codes per coordinate
(kvbench.methods.settings.lloydmax)."""
from __future__ import annotations

import math

import mlx.core as mx

from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.core.contracts import Packed
from kvbench.methods.mlx.codebooks import MLXCodebook
from kvbench.methods.mlx.packing import pack_bits, unpack_bits
from kvbench.methods.mlx.tokenwise import MLXTokenwiseCodec
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.lloydmax import LloydMax

_TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny


class MLXLloydMaxCodec(MLXTokenwiseCodec):
    """LloydMaxCodec on mx.array, with the torch codec's codebook and rotation (its float32
    Q = HaarRotation(D, rotation_seed)), so both backends quantize against the same numbers.
    reference: that torch LloydMaxCodec. Stored tensors, as torch: codes uint8
    (..., tokens, ceil(bits * D / 8)), norms float32 (..., tokens, 1)."""

    def __init__(self, reference):
        self.reference = reference
        self.bits, self.rotate = reference.bits, reference.rotate
        self.rotation_seed = reference.rotation_seed
        self.codebook = MLXCodebook(reference.codebook)
        self._rotations: dict[int, mx.array] = {}  # Q per head_dim, float32

    @property
    def chunk_separable(self) -> bool:
        """As the reference's (kvbench.methods.settings.lloydmax): only without the rotation's matmul."""
        return not self.rotate

    def _rotation(self, dim: int) -> mx.array:
        if dim not in self._rotations:
            matrix = self.reference.rotation_matrix(dim, "cpu")  # float32 Q
            self._rotations[dim] = mx.array(matrix.numpy())
        return self._rotations[dim]

    def encode(self, x: mx.array) -> Packed:
        dim = x.shape[-1]
        v = x.astype(mx.float32)
        if self.rotate:
            v = v @ self._rotation(dim).T  # Q x for every row x
        norms = mx.linalg.norm(v, axis=-1, keepdims=True)
        # A zero vector divides by tiny instead: any codes, its norm decodes it to zeros.
        unit = v / mx.maximum(norms, _TINY)
        codes = self.codebook.quantize(unit * math.sqrt(dim))
        return Packed({"codes": pack_bits(codes, self.bits), "norms": norms}, tuple(x.shape),
                      x.dtype)

    def decode(self, packed: Packed) -> mx.array:
        dim = packed.shape[-1]
        codes = unpack_bits(packed.tensors["codes"], self.bits, dim)
        v = self.codebook.dequantize(codes) / math.sqrt(dim) * packed.tensors["norms"]
        if self.rotate:
            v = v @ self._rotation(dim)  # Q^T y
        return v.astype(packed.dtype)

    def layout(self) -> str:
        return self.reference.layout()


@implements(LloydMax, backend="mlx")
class MLXLloydMax(CodecMethod):
    settings: LloydMax

    def codec(self) -> MLXLloydMaxCodec:
        from kvbench.methods.torch.lloydmax import LloydMaxCodec  # the reference's constants

        s = self.settings
        return MLXLloydMaxCodec(LloydMaxCodec(s.bits, s.rotate, s.rotation_seed))
