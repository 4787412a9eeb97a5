"""`lloydmax`: ManthanQuant-style per-vector norm plus N(0, 1) Lloyd-Max codes per coordinate."""
from __future__ import annotations

from typing import Any, ClassVar

import math
from dataclasses import dataclass

import torch

from kvbench.kernels import Impl
from kvbench.kernels.formats import CodebookFormat
from kvbench.methods.base import Method, Packed, register_method, run_as, start_impl
from kvbench.methods.codebooks import lloyd_max
from kvbench.methods.codec_cache import CodecCache
from kvbench.methods.packing import pack_bits, unpack_bits
from kvbench.methods.rounding import divide, pairwise_norm
from kvbench.methods.rotation import HaarRotation
from kvbench.methods.tokenwise import TokenwiseCodec


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
        (kvbench.methods.base.Codec.chunk_separable)."""
        return not self.rotate

    def _rotation(self, dim: int, device: torch.device) -> torch.Tensor:
        if dim not in self._rotations:
            self._rotations[dim] = HaarRotation(dim, self.rotation_seed).matrix
        return self._rotations[dim].to(device, torch.float32)

    def encode_block(self, x: torch.Tensor) -> Packed:
        dim = x.shape[-1]
        v = x.float()
        if self.rotate:
            v = v @ self._rotation(dim, x.device).T  # Q x for every row x
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
            v = v @ self._rotation(dim, v.device)  # Q^T y
        return v.to(packed.dtype)

    def kernel_unsupported(self) -> str | None:
        if self.rotate:
            return "rotate: a dense rotation is a matrix product, rounded as the BLAS rounds it"
        return None

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


@register_method("lloydmax")
@dataclass
class LloydMax(Method):
    """ManthanQuant-style Lloyd-Max quantization of keys and values, the same codec for both.

    Scheme (ManthanQuant): per vector x of head_dim D, r = ||x|| is stored as float32;
    s = x / r * sqrt(D) has coordinates near N(0, 1); each is replaced by the index of the nearest
    N(0, 1) Lloyd-Max centroid, packed at `bits` bits, little-endian, spanning bytes.
    Decode: x_hat = c[index] / sqrt(D) * r. Faithful to upstream: no rotation and no norm
    correction, so outlier channels stay where they are and ||x_hat|| != ||x||.
    Bytes per vector: 4 + ceil(bits * D / 8); at D = 256, bits = 3: 100 B (5.12x against 16-bit).

    Parameters:
        bits: int = 3 — bits per coordinate, 1..8.
        rotate: bool = False — turn each vector by a seeded random orthogonal D x D matrix before
            coding and back after decoding (not upstream; shows what the missing rotation costs on
            keys with outlier channels). Not counted as stored bytes: it is regenerated.
        rotation_seed: int = 0 — seed of the rotation's own generator (>= 0), not the data's.
        window: int = 0 — newest tokens kept in full precision (>= 0).
        impl: "auto" | "torch" | "triton" = "auto" — who encodes and decodes: the torch
            reference, or the Triton kernels (the same bytes; kvbench.kernels); auto: the
            kernels on CUDA where triton is installed. Kernels need rotate false, head_dim >= 8.
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).

    Defaults: upstream atcuality2021/manthanquant manthanquant/x86_quantize.py tq_encode_torch
    (bits=3, float32 radius, N(0, 1) 3-bit table, no rotation; the CUDA kernel's seed is unused,
    manthanquant-x86 csrc/turboquant_kernel.cu, bits 2..4 only); rotate/window are kvbench's.
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({}, {"rotate": True, "window": 8})

    bits: int = 3
    rotate: bool = False
    rotation_seed: int = 0
    window: int = 0
    impl: Impl = "auto"

    def __post_init__(self):
        if not isinstance(self.bits, int) or not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be an int in 1..8, got {self.bits!r}")
        if not isinstance(self.rotate, bool):
            raise ValueError(f"rotate must be true or false, got {self.rotate!r}")
        if not isinstance(self.rotation_seed, int) or self.rotation_seed < 0:
            raise ValueError(f"rotation_seed must be an int >= 0, got {self.rotation_seed!r}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window!r}")
        start_impl(self)

    def codec(self) -> LloydMaxCodec:
        return run_as(self, LloydMaxCodec(self.bits, self.rotate, self.rotation_seed))

    def new_layer_cache(self, layer_idx: int) -> CodecCache:
        return CodecCache(self.codec(), self.codec(), window=self.window)
