"""`lloydmax` on torch: ManthanQuant-style per-vector norm plus N(0, 1) Lloyd-Max codes per
coordinate (kvbench.methods.settings.lloydmax)."""
from __future__ import annotations

import math

import torch

from kvbench.kernels.formats import CodebookFormat, lloydmax_unsupported
from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.core.contracts import Packed
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.lloydmax import LloydMax
from kvbench.methods.torch.codebooks import lloyd_max
from kvbench.methods.torch.packing import pack_bits, unpack_bits
from kvbench.methods.torch.rotation import HaarRotation
from kvbench.methods.torch.rounding import divide, pairwise_norm
from kvbench.methods.torch.tokenwise import TokenwiseCodec


class LloydMaxCodec(TokenwiseCodec):
    """Per vector x of D channels: r = ||x|| as float32, s = x / r * sqrt(D), each s_i coded by the
    nearest N(0, 1) Lloyd-Max centroid; decode c[index] / sqrt(D) * r. With rotate, x is first
    turned by Q = HaarRotation(D, rotation_seed) (Q x) and turned back (Q^T) after decoding.

    Stored tensors: codes uint8 (..., tokens, ceil(bits * D / 8)), each vector packed on its own;
    norms float32 (..., tokens, 1). 4 + ceil(bits * D / 8) bytes per vector; the rotation is
    regenerated from its seed, never stored.
    """

    def __init__(self, bits: int, rotate: bool = False, rotation_seed: int = 0):
        self.bits = bits
        self.rotate = rotate
        self.rotation_seed = rotation_seed
        self.codebook = lloyd_max("gaussian", bits)
        self._rotations: dict[int, torch.Tensor] = {}  # Q per head_dim, float64 on the CPU

    @property
    def chunk_separable(self) -> bool:
        """Without rotation decode is elementwise (codebook lookup, times norm / sqrt(D)); with it,
        the product by Q^T is a matrix multiply whose kernel, and so whose rounding, can change
        with the rows decoded at once (CPU BLAS switches kernels below 4 rows): decoding chunk by
        chunk is not bit-identical to decoding them merged
        (kvbench.methods.core.contracts.Codec.chunk_separable)."""
        return not self.rotate

    def rotation_matrix(self, dim: int, device: torch.device | str) -> torch.Tensor:
        """Q as float32 on `device` (made once per dim, in float64 on the CPU)."""
        if dim not in self._rotations:
            self._rotations[dim] = HaarRotation(dim, self.rotation_seed).matrix
        return self._rotations[dim].to(device, torch.float32)

    def encode_block(self, x: torch.Tensor) -> Packed:
        dim = x.shape[-1]
        v = x.float()
        if self.rotate:
            v = v @ self.rotation_matrix(dim, x.device).T  # Q x for every row x
        norms = pairwise_norm(v, keepdim=True)
        # A zero vector (r == 0) divides by tiny instead: any codes, r decodes it to zeros.
        unit = v / norms.clamp_min(torch.finfo(torch.float32).tiny)
        codes = self.codebook.quantize(unit * math.sqrt(dim))
        packed = {"codes": pack_bits(codes, self.bits), "norms": norms}
        return Packed(packed, tuple(x.shape), x.dtype)

    def decode_block(self, packed: Packed) -> torch.Tensor:
        dim = packed.shape[-1]
        codes = unpack_bits(packed.tensors["codes"], self.bits, dim)
        v = divide(self.codebook.dequantize(codes), math.sqrt(dim)) * packed.tensors["norms"]
        if self.rotate:
            v = v @ self.rotation_matrix(dim, v.device)  # Q^T y
        return v.to(packed.dtype)

    def kernel_unsupported(self) -> str | None:
        return lloydmax_unsupported(self.rotate)

    def kernel_format(self, dim: int) -> CodebookFormat:
        return CodebookFormat("lloydmax", self.bits, dim, self.codebook.centroids,
                              self.codebook.float32_bounds, torch.float32, "norms",
                              math.sqrt(dim))

    def layout(self) -> str:
        rotation = (
            f"seeded random rotation (seed {self.rotation_seed}, not stored)" if self.rotate
            else "no rotation"
        )
        return (
            f"lloydmax {self.bits}-bit N(0,1) Lloyd-Max codes of x / ||x|| * sqrt(D), "
            f"float32 norm per vector, {rotation}, no norm correction"
        )


@implements(LloydMax)
class TorchLloydMax(CodecMethod):
    settings: LloydMax

    def codec(self) -> LloydMaxCodec:
        s = self.settings
        return self.run_as(LloydMaxCodec(s.bits, s.rotate, s.rotation_seed))
