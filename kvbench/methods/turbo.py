"""`turbo` and presets turbo2, turbo2.5, turbo3, turbo3.5, turbo4: TurboQuant / PolarQuant."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from kvbench.methods.base import Method, Packed, register_method
from kvbench.methods.codebooks import Codebook, gaussian_moments, lloyd_max
from kvbench.methods.codec_cache import CodecCache
from kvbench.methods.packing import pack_bits, unpack_bits
from kvbench.methods.rotation import make_rotation
from kvbench.methods.tokenwise import TokenwiseCodec

# The llama.cpp fork's 4-bit table for blocks of 128 (positive half; the table is symmetric):
# CENTROIDS_4BIT in TheTom/llama-cpp-turboquant ggml/src/ggml-turbo-quant.c (commit 1e4fa6f),
# also its Metal and CUDA kernels. Narrower than Lloyd-Max for N(0, 1/128), whose outermost
# centroid is 2.7326 / sqrt(128) = 0.2415.
LLAMACPP_4BIT_128 = (0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195,
                     0.173926)
QJL_SEED_OFFSET = 1000  # QJL matrix seed = seed + 1000, as upstream (rotation 42, QJL 1042)


def llamacpp_codebook() -> Codebook:
    """The fork's 4-bit table as a Codebook, with its MSE under N(0, 1/128)."""
    half = torch.tensor(LLAMACPP_4BIT_128, dtype=torch.float64)
    centroids = torch.cat([-half.flip(0), half])
    boundaries = (centroids[1:] + centroids[:-1]) / 2
    # Cell moments of N(0, 1) at sqrt(128) times the edges, scaled back by 1/128.
    edges = torch.cat([torch.tensor([-math.inf]), boundaries, torch.tensor([math.inf])])
    mass, first, second = gaussian_moments(edges[:-1] * math.sqrt(128), edges[1:] * math.sqrt(128))
    c = centroids * math.sqrt(128)
    mse = float((second - 2 * c * first + c * c * mass).sum()) / 128
    return Codebook(centroids, boundaries, mse, "llamacpp", 4, 128)


class TurboCodec(TokenwiseCodec):
    """Per block of `block` values along head_dim: norm, rotation, nearest centroid per
    coordinate, optionally a 1-bit QJL sketch of the residual. See `Turbo` for the scheme.

    Stored tensors, for x of shape (..., tokens, head_dim) and G = head_dim / block blocks:
    codes uint8 (..., tokens, G, ceil((block - n_high) * b / 8)) for the b-bit coordinates;
    codes_high uint8 (..., tokens, G, ceil(n_high * (b + 1) / 8)) when n_high > 0;
    norm float16 (..., tokens, G); with qjl also signs uint8 (..., tokens, G, block / 8) and
    rnorm float16 (..., tokens, G). b is bits, or bits - 1 with qjl.
    """

    def __init__(self, bits: int, block: int, rotation: str, codebook: str, norm_correction: bool,
                 outlier_fraction: float, qjl: bool, seed: int):
        self.bits, self.block, self.codebook = bits, block, codebook
        self.norm_correction, self.qjl = norm_correction, qjl
        self.rotation_kind = rotation
        self.mse_bits = bits - 1 if qjl else bits
        self.n_high = round(outlier_fraction * block)
        self.low = self._codebook(self.mse_bits)
        self.high = self._codebook(self.mse_bits + 1) if self.n_high else None
        self.rotation = make_rotation(rotation, block, seed)
        if qjl:
            generator = torch.Generator().manual_seed(seed + QJL_SEED_OFFSET)
            self.qjl_matrix = torch.randn(block, block, generator=generator, dtype=torch.float64)

    def _codebook(self, bits: int) -> Codebook:
        if self.codebook == "llamacpp":
            return llamacpp_codebook()
        return lloyd_max("gaussian_d" if self.codebook == "gaussian" else "beta", bits, self.block)

    def _centroids(self, idx_high: torch.Tensor | None, idx_low: torch.Tensor) -> torch.Tensor:
        low = self.low.dequantize(idx_low)
        return low if idx_high is None else torch.cat([self.high.dequantize(idx_high), low], -1)

    def encode_block(self, x: torch.Tensor) -> Packed:
        dim = x.shape[-1]
        if dim % self.block:
            raise ValueError(f"head_dim {dim} is not a multiple of block {self.block}")
        blocks = x.float().unflatten(-1, (dim // self.block, self.block))
        gamma = blocks.norm(dim=-1)
        y = self.rotation.forward(blocks / torch.where(gamma == 0, 1.0, gamma)[..., None])
        n = self.n_high
        idx_high = self.high.quantize(y[..., :n]) if n else None
        idx_low = self.low.quantize(y[..., n:])
        c = self._centroids(idx_high, idx_low)
        if self.norm_correction:
            c_norm = c.norm(dim=-1)
            norm = (gamma / torch.where(c_norm == 0, 1.0, c_norm)).half()
        else:
            norm = gamma.half()
        tensors = {"codes": pack_bits(idx_low, self.mse_bits), "norm": norm}
        if n:
            tensors["codes_high"] = pack_bits(idx_high, self.mse_bits + 1)
        if self.qjl:
            # The residual of what decode will rebuild from the stored fp16 norm, in x's scale.
            residual = blocks - self.rotation.inverse(c) * norm.float()[..., None]
            projected = residual @ self.qjl_matrix.T.float()
            tensors["signs"] = pack_bits((projected >= 0).to(torch.uint8), 1)
            tensors["rnorm"] = residual.norm(dim=-1).half()
        return Packed(tensors, tuple(x.shape), x.dtype)

    def decode_block(self, packed: Packed) -> torch.Tensor:
        t = packed.tensors
        n = self.n_high
        idx_low = unpack_bits(t["codes"], self.mse_bits, self.block - n)
        idx_high = unpack_bits(t["codes_high"], self.mse_bits + 1, n) if n else None
        c = self._centroids(idx_high, idx_low)
        blocks = self.rotation.inverse(c) * t["norm"].float()[..., None]
        if self.qjl:
            signs = unpack_bits(t["signs"], 1, self.block).float() * 2 - 1
            scale = math.sqrt(math.pi / 2) / self.block * t["rnorm"].float()[..., None]
            blocks = blocks + scale * (signs @ self.qjl_matrix.float())
        return blocks.flatten(-2).to(packed.dtype)

    def layout(self) -> str:
        coords = f"{self.mse_bits}-bit codes"
        if self.n_high:
            coords += (f" ({self.n_high} of {self.block} rotated coordinates at "
                       f"{self.mse_bits + 1} bits)")
        qjl = "qjl on (+1-bit signs, +fp16 residual norm per block)" if self.qjl else "qjl off"
        norm = "norm-corrected" if self.norm_correction else "plain"
        return (
            f"turbo {self.bits}-bit: {coords}, blocks of {self.block} along head_dim, "
            f"fp16 {norm} norm per block, {self.rotation_kind} rotation, {self.codebook} codebook, "
            f"{qjl}"
        )


@register_method("turbo")
@dataclass
class Turbo(Method):
    """TurboQuant / PolarQuant: per block a norm, a seeded rotation, a Lloyd-Max code per value.

    Source: Zandieh et al., arXiv 2504.19874; TurboQuant+ (TheTom/turboquant_plus and its MLX
    port ediestel/turboquant-plus-mlx) and the llama.cpp fork for norm correction and presets.

    Scheme, per block of QK = `block` values x along head_dim: gamma = ||x||, u = x / gamma,
    y = R u, index = nearest centroid of the b-bit codebook for N(0, 1/QK); store the indices
    (packed at b bits) and one fp16 norm; decode x_hat = R^T c[index] * norm.
    Bits per value: b + f + 16/QK (f the outlier fraction), so turbo3 is 3.125 at QK = 128
    (5.12x vs fp16) and 3.5 at QK = 32 (4.57x: the original layout, and the "3.5 bits/val" of
    TurboQuant+'s cache-type table, whose turbo2 2.5 is also QK = 32 and whose turbo4 4.25 is
    the fork's 3-bit + QJL block of 128 with two fp16 norms, i.e. bits=4, qjl=True here).

    Parameters:
        bits: int = 3 — 2, 3 or 4 bits per coordinate (counting the QJL bit when qjl is on).
        block: int = 128 — QK; head_dim must be a multiple (checked at encode); a power of two
            for the Hadamard rotation. 32 is the original layout.
        rotation: "hadamard" | "haar" = "hadamard" — (1/sqrt(QK)) D2 H D1 with seeded signs, as
            upstream; or a dense Haar-random orthogonal matrix (QR of a seeded Gaussian).
        codebook: "gaussian" | "beta" | "llamacpp" = "gaussian" — Lloyd-Max for N(0, 1/QK) as
            upstream; for the exact coordinate density of a random unit vector; or the llama.cpp
            fork's narrower 4-bit table (only bits=4, block=128, no outliers, no qjl).
        norm_correction: bool = True — faithful to TurboQuant+: store gamma / ||c[index]|| so the
            decoded block has norm gamma. False stores gamma itself (the paper's form).
        outlier_fraction: float = 0.0 — in [0, 1): the first round(f * QK) rotated coordinates
            get one more bit. After the rotation every coordinate has the same law, so which ones
            is immaterial and one norm serves the block. (Upstream's outlier.py splits the
            unrotated channels instead, each part with its own rotation and float32 norm; not
            implemented.) f = 0.5 gives the 2.5 and 3.5 presets.
        qjl: bool = False — the paper's inner-product variant: a (bits-1)-bit MSE stage, then
            signs s = sign(S r) of the block's residual r = x - x_hat_mse with S a seeded Gaussian
            QK x QK matrix, and ||r|| in fp16; decode adds sqrt(pi/2)/QK * ||r|| * S^T s.
            Unbiased inner products, higher variance (upstream dropped it for that reason).
            Costs one more fp16 per block: b + f + 32/QK per value. ||r|| is taken in x's
            scale, after the fp16 rounding of the stored norm, so decode needs no gamma. This
            is upstream's TurboQuant class, the one its README's MSE/cosine rows were run with.
        seed: int = 0 — rotation seed; the QJL matrix uses seed + 1000 (as upstream).
        window: int = 0 — newest tokens kept in full precision by the cache (>= 0).
    Tensors: keys and values (batch, kv_heads, tokens, head_dim), the same codec for both.
    """

    bits: int = 3
    block: int = 128
    rotation: Literal["hadamard", "haar"] = "hadamard"
    codebook: Literal["gaussian", "beta", "llamacpp"] = "gaussian"
    norm_correction: bool = True
    outlier_fraction: float = 0.0
    qjl: bool = False
    seed: int = 0
    window: int = 0

    def __post_init__(self):
        if self.bits not in (2, 3, 4):
            raise ValueError(f"bits must be 2, 3 or 4, got {self.bits!r}")
        if self.block < 2:
            raise ValueError(f"block must be >= 2, got {self.block!r}")
        if self.rotation not in ("hadamard", "haar"):
            raise ValueError(f"rotation must be 'hadamard' or 'haar', got {self.rotation!r}")
        if self.rotation == "hadamard" and self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two for the hadamard rotation, "
                             f"got {self.block!r}")
        if self.codebook not in ("gaussian", "beta", "llamacpp"):
            raise ValueError(f"codebook must be 'gaussian', 'beta' or 'llamacpp', "
                             f"got {self.codebook!r}")
        if not 0 <= self.outlier_fraction < 1:
            raise ValueError(f"outlier_fraction must be in [0, 1), got {self.outlier_fraction!r}")
        fits_table = (self.bits, self.block, self.qjl, self.outlier_fraction) == (4, 128, False, 0)
        if self.codebook == "llamacpp" and not fits_table:
            raise ValueError("codebook 'llamacpp' is the fork's 4-bit table for blocks of 128: "
                             "it needs bits=4, block=128, qjl=False, outlier_fraction=0")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window!r}")

    def codec(self) -> TurboCodec:
        return TurboCodec(self.bits, self.block, self.rotation, self.codebook,
                          self.norm_correction, self.outlier_fraction, self.qjl, self.seed)

    def new_layer_cache(self, layer_idx: int) -> CodecCache:
        return CodecCache(self.codec(), self.codec(), window=self.window)


# Presets: TurboQuant+'s cache types at this module's defaults (block 128, MSE path). Its README
# disagrees with itself on their size (benchmark table: turbo3 3.0 bits and 4.6x; cache-type
# table: 3.5 bits and 4.6x; see Turbo for what each layout is). 2.5 and 3.5 follow its
# outlier.py, which puts half the channels one bit up (its docstring's "32 of 128" is 2.25 bits).


@register_method("turbo2")
@dataclass
class Turbo2(Turbo):
    """turbo preset: 2 bits per coordinate (2.125 bits/value at block 128)."""

    bits: int = 2


@register_method("turbo2.5")
@dataclass
class Turbo2_5(Turbo):
    """turbo preset: half the rotated coordinates at 3 bits, half at 2 (2.625 bits/value)."""

    bits: int = 2
    outlier_fraction: float = 0.5


@register_method("turbo3")
@dataclass
class Turbo3(Turbo):
    """turbo preset: 3 bits per coordinate (3.125 bits/value at block 128)."""

    bits: int = 3


@register_method("turbo3.5")
@dataclass
class Turbo3_5(Turbo):
    """turbo preset: half the rotated coordinates at 4 bits, half at 3 (3.625 bits/value)."""

    bits: int = 3
    outlier_fraction: float = 0.5


@register_method("turbo4")
@dataclass
class Turbo4(Turbo):
    """turbo preset: 4 bits per coordinate (4.125 bits/value at block 128)."""

    bits: int = 4
