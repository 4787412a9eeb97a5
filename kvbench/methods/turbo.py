"""`turbo` and presets turbo2, turbo2.5, turbo3, turbo3.5, turbo4: TurboQuant / PolarQuant."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from kvbench.kernels import Impl
from kvbench.kernels.formats import CodebookFormat
from kvbench.methods.base import Method, Packed, register_method, run_as, start_impl
from kvbench.methods.codebooks import Codebook, gaussian_moments, lloyd_max
from kvbench.methods.codec_cache import CodecCache
from kvbench.methods.packing import pack_bits, unpack_bits
from kvbench.methods.rounding import pairwise_norm
from kvbench.methods.rotation import HaarRotation, SignedHadamard, make_rotation
from kvbench.methods.tokenwise import TokenwiseCodec

# The llama.cpp fork's 4-bit table for blocks of 128 (positive half; the table is symmetric):
# CENTROIDS_4BIT in TheTom/llama-cpp-turboquant ggml/src/ggml-turbo-quant.c (commit 1e4fa6f),
# also its Metal and CUDA kernels. Narrower than Lloyd-Max for N(0, 1/128), whose outermost
# centroid is 2.7326 / sqrt(128) = 0.2415.
LLAMACPP_4BIT_128 = (0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195,
                     0.173926)
QJL_SEED_OFFSET = 1000  # QJL matrix seed = seed + 1000, as upstream (rotation 42, QJL 1042)
NORMAL_PART_SEED_OFFSET = 500  # channel split: outlier part rotation seed, normal part + 500


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


class _Part:
    """Channels of a block that are quantized together: one rotation, one norm, one code per
    rotated coordinate. channels: int64 positions in the block, or None for all of them in order.
    The first n_high rotated coordinates take the codebook `high` (b+1 bits), the rest `low`."""

    def __init__(self, channels: torch.Tensor | None, rotation: SignedHadamard | HaarRotation,
                 n_high: int, low: Codebook | None, high: Codebook | None, norm_name: str):
        self.channels, self.rotation, self.n_high = channels, rotation, n_high
        self.low, self.high, self.norm_name = low, high, norm_name
        self.dim = rotation.dim

    def take(self, blocks: torch.Tensor) -> torch.Tensor:
        if self.channels is None:
            return blocks
        return blocks.index_select(-1, self.channels.to(blocks.device))

    def centroids(self, idx_high: torch.Tensor | None, idx_low: torch.Tensor | None):
        found = [book.dequantize(idx) for book, idx in ((self.high, idx_high), (self.low, idx_low))
                 if idx is not None]
        return found[0] if len(found) == 1 else torch.cat(found, -1)


class TurboCodec(TokenwiseCodec):
    """Per block of `block` values along head_dim: norm, rotation, nearest centroid per
    coordinate, optionally a 1-bit QJL sketch of the residual. See `Turbo` for the scheme.

    Stored tensors, for x of shape (..., tokens, head_dim), G = head_dim / block blocks and
    n_high = round(outlier_fraction * block):
    - rotated split (or no outliers): codes uint8 (..., tokens, G, ceil((block - n_high) * b / 8))
      for the b-bit coordinates; codes_high uint8 (..., tokens, G, ceil(n_high * (b + 1) / 8))
      when n_high > 0; norm float16 (..., tokens, G).
    - channel split (n_high > 0): codes_high uint8 (..., tokens, G, ceil(n_high * (b + 1) / 8))
      and norm_high float32 (..., tokens, G) for the outlier channels; codes uint8
      (..., tokens, G, ceil((block - n_high) * b / 8)) and norm float32 (..., tokens, G) for the
      others.
    With qjl also signs uint8 (..., tokens, G, ceil(block / 8)) and rnorm (..., tokens, G), in the
    norms' dtype. b is bits, or bits - 1 with qjl.
    """

    # Not chunk separable (kvbench.methods.base.Codec.chunk_separable): decode multiplies by
    # the inverse rotation (and the QJL matrix), matrix products whose kernel, and so whose
    # rounding, may change with the rows decoded at once (the CPU BLAS switches kernels
    # below 4 rows), so a chunk decoded alone can differ in the last bit from the same chunk
    # decoded inside the merged block; its caches keep the packed read path. (The Hadamard
    # rotation is now butterflies, row by row, but the MLX twin still decodes by products.)
    chunk_separable = False

    def __init__(self, bits: int, block: int, rotation: str, codebook: str, norm_correction: bool,
                 outlier_fraction: float, qjl: bool, seed: int, outlier_split: str = "rotated",
                 outlier_channels: tuple[int, ...] | None = None):
        self.bits, self.block, self.codebook = bits, block, codebook
        self.norm_correction, self.qjl = norm_correction, qjl
        self.rotation_kind = rotation
        self.mse_bits = bits - 1 if qjl else bits
        self.n_high = round(outlier_fraction * block)
        self.channel_split = outlier_split == "channels" and self.n_high > 0
        self.given_channels = outlier_channels is not None
        b = self.mse_bits
        if self.channel_split:
            # Upstream's OutlierTurboQuant: each part its own rotation (seeds seed, seed + 500)
            # and its own codebook for its own dimension; float32 norms.
            self.norm_dtype = torch.float32
            outliers = torch.tensor(outlier_channels if self.given_channels
                                    else range(self.n_high), dtype=torch.long)
            normal = torch.ones(block, dtype=torch.bool)
            normal[outliers] = False
            normal = normal.nonzero().flatten()  # ascending, like upstream's np.setdiff1d
            n_low = block - self.n_high
            self.parts = [
                _Part(outliers, make_rotation(rotation, self.n_high, seed), self.n_high,
                      None, self._codebook(b + 1, self.n_high), "norm_high"),
                _Part(normal, make_rotation(rotation, n_low, seed + NORMAL_PART_SEED_OFFSET), 0,
                      self._codebook(b, n_low), None, "norm"),
            ]
        else:
            self.norm_dtype = torch.float16
            high = self._codebook(b + 1, block) if self.n_high else None
            self.parts = [_Part(None, make_rotation(rotation, block, seed), self.n_high,
                                self._codebook(b, block), high, "norm")]
        if qjl:
            generator = torch.Generator().manual_seed(seed + QJL_SEED_OFFSET)
            self.qjl_matrix = torch.randn(block, block, generator=generator, dtype=torch.float64)

    @property
    def outlier_channels(self) -> torch.Tensor | None:
        """Positions in the block of the channels split off at b+1 bits (channel split only)."""
        return self.parts[0].channels if self.channel_split else None

    def _codebook(self, bits: int, dim: int) -> Codebook:
        if self.codebook == "llamacpp":
            return llamacpp_codebook()
        return lloyd_max("gaussian_d" if self.codebook == "gaussian" else "beta", bits, dim)

    def _assemble(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Blocks (..., G, block) from each part's decoded channels."""
        if len(parts) == 1 and self.parts[0].channels is None:
            return parts[0]
        out = parts[0].new_empty((*parts[0].shape[:-1], self.block))
        for part, values in zip(self.parts, parts):
            out.index_copy_(-1, part.channels.to(out.device), values)
        return out

    def encode_block(self, x: torch.Tensor) -> Packed:
        dim = x.shape[-1]
        if dim % self.block:
            raise ValueError(f"head_dim {dim} is not a multiple of block {self.block}")
        blocks = x.float().unflatten(-1, (dim // self.block, self.block))
        tensors, decoded = {}, []
        for part in self.parts:
            v = part.take(blocks)
            gamma = pairwise_norm(v)
            y = part.rotation.forward(v / torch.where(gamma == 0, 1.0, gamma)[..., None])
            n = part.n_high
            idx_high = part.high.quantize(y[..., :n]) if n else None
            idx_low = part.low.quantize(y[..., n:]) if n < part.dim else None
            c = part.centroids(idx_high, idx_low)
            if self.norm_correction:
                c_norm = pairwise_norm(c)
                norm = (gamma / torch.where(c_norm == 0, 1.0, c_norm)).to(self.norm_dtype)
            else:
                norm = gamma.to(self.norm_dtype)
            tensors[part.norm_name] = norm
            if idx_low is not None:
                tensors["codes"] = pack_bits(idx_low, self.mse_bits)
            if idx_high is not None:
                tensors["codes_high"] = pack_bits(idx_high, self.mse_bits + 1)
            if self.qjl:
                decoded.append(part.rotation.inverse(c) * norm.float()[..., None])
        if self.qjl:
            # The residual of what decode will rebuild from the stored norms, in x's scale.
            residual = blocks - self._assemble(decoded)
            projected = residual @ self.qjl_matrix.T.to(residual.device, torch.float32)
            tensors["signs"] = pack_bits((projected >= 0).to(torch.uint8), 1)
            tensors["rnorm"] = pairwise_norm(residual).to(self.norm_dtype)
        return Packed(tensors, tuple(x.shape), x.dtype)

    def decode_block(self, packed: Packed) -> torch.Tensor:
        t = packed.tensors
        decoded = []
        for part in self.parts:
            n, n_low = part.n_high, part.dim - part.n_high
            idx_high = unpack_bits(t["codes_high"], self.mse_bits + 1, n) if n else None
            idx_low = unpack_bits(t["codes"], self.mse_bits, n_low) if n_low else None
            c = part.centroids(idx_high, idx_low)
            decoded.append(part.rotation.inverse(c) * t[part.norm_name].float()[..., None])
        blocks = self._assemble(decoded)
        if self.qjl:
            signs = unpack_bits(t["signs"], 1, self.block).float() * 2 - 1
            scale = math.sqrt(math.pi / 2) / self.block * t["rnorm"].float()[..., None]
            blocks = blocks + scale * (signs @ self.qjl_matrix.to(signs.device, torch.float32))
        return blocks.flatten(-2).to(packed.dtype)

    def kernel_unsupported(self) -> str | None:
        if self.qjl:
            return "qjl: its sketch is a dense matrix product"
        if self.n_high:
            return "outlier_fraction > 0"
        if self.rotation_kind != "hadamard":
            return "rotation 'haar': a dense matrix product, rounded as the BLAS rounds it"
        return None

    def kernel_format(self, dim: int) -> CodebookFormat:
        part = self.parts[0]
        return CodebookFormat("turbo", self.bits, self.block, part.low.centroids,
                              part.low.float32_bounds, self.norm_dtype, "norm",
                              math.sqrt(self.block), (part.rotation.d1, part.rotation.d2),
                              self.norm_correction)

    def layout(self) -> str:
        b = self.mse_bits
        norm = "norm-corrected" if self.norm_correction else "plain"
        if self.channel_split:
            which = "given" if self.given_channels else "first"
            dtype = "fp32"
            coords = (f"channel split: {which} {self.n_high} of {self.block} channels at "
                      f"{b + 1}-bit codes, the other {self.block - self.n_high} at {b}-bit, "
                      f"blocks of {self.block} along head_dim, each part with its own "
                      f"{self.rotation_kind} rotation and fp32 {norm} norm")
        else:
            dtype = "fp16"
            coords = f"{b}-bit codes"
            if self.n_high:
                coords += f" ({self.n_high} of {self.block} rotated coordinates at {b + 1} bits)"
            coords += (f", blocks of {self.block} along head_dim, fp16 {norm} norm per block, "
                       f"{self.rotation_kind} rotation")
        qjl = (f"qjl on (+1-bit signs, +{dtype} residual norm per block)" if self.qjl
               else "qjl off")
        return f"turbo {self.bits}-bit: {coords}, {self.codebook} codebook, {qjl}"


def channels_by_magnitude(x: torch.Tensor, n: int) -> tuple[int, ...]:
    """The n channels (last dim of x, one block) of largest mean |x| over every other dim,
    largest first: upstream's calibrate_outlier_channels (turboquant/calibration.py), for
    `outlier_channels`. x: (..., block), e.g. calibration keys (batch, heads, tokens, head_dim)."""
    if not 0 <= n <= x.shape[-1]:
        raise ValueError(f"n must be in [0, {x.shape[-1]}], got {n!r}")
    score = x.detach().abs().float().reshape(-1, x.shape[-1]).mean(0)
    order = torch.argsort(score, stable=True)  # ascending; then the top n, largest first
    return tuple(int(i) for i in order.flip(0)[:n])


@register_method("turbo")
@dataclass
class Turbo(Method):
    """TurboQuant / PolarQuant: per block a norm, a seeded rotation, a Lloyd-Max code per value.

    Source: Zandieh et al., arXiv 2504.19874; TurboQuant+ (TheTom/turboquant_plus and its MLX
    port ediestel/turboquant-plus-mlx) and the llama.cpp fork for norm correction and presets;
    the channel split follows turboquant/outlier.py (OutlierTurboQuant) in both.

    Scheme, per block of QK = `block` values x along head_dim: gamma = ||x||, u = x / gamma,
    y = R u, index = nearest centroid of the b-bit codebook for N(0, 1/QK); store the indices
    (packed at b bits) and one fp16 norm; decode x_hat = R^T c[index] * norm.
    Bits per value: b + f + 16/QK (f the outlier fraction, rotated split), so turbo3 is 3.125 at
    QK = 128 (5.12x vs fp16) and 3.5 at QK = 32 (4.57x: the original layout, and the "3.5
    bits/val" of TurboQuant+'s cache-type table, whose turbo2 2.5 is also QK = 32 and whose
    turbo4 4.25 is the fork's 3-bit + QJL block of 128 with two fp16 norms, i.e. bits=4,
    qjl=True here). Channel split, n = round(f * QK) outlier channels: per block
    ceil(n (b+1) / 8) + ceil((QK - n) b / 8) + 8 bytes (two float32 norms), b + f + 64/QK bits
    per value when the parts fill whole bytes: 3.0 for turbo2.5 and 4.0 for turbo3.5 at
    QK = 128. qjl adds ceil(QK / 8) sign bytes and one more norm (fp16; float32 with the channel
    split) per block.
    Upstream's figures for the split, against its code: outlier.py's docstring makes 2.5 bits
    of "32/128 outlier at 3b + 96/128 normal at 2b" (that is 2.25 bits); its code puts
    round(0.5 * 128) = 64 channels up for 2.5 and 3.5 alike, and so does this. Its
    effective_bits (2.5, 3.5; the README's "Eff. Bits") counts code bits only; its
    compression_ratio adds three float32 norms (96 bits per vector): 4.92x and 3.76x, the
    README's "4.9x" and "3.8x", which are turbo2.5 / turbo3.5 with qjl=True here at QK = 128
    (3.25 and 4.25 bits). OutlierTurboQuant is the QJL variant (each part's PolarQuant at one
    bit less, then 1-bit QJL of the whole residual): qjl=True; the presets keep the MSE path.

    Parameters:
        bits: int = 3 — 2, 3 or 4 bits per coordinate (counting the QJL bit when qjl is on).
        block: int = 128 — QK; head_dim must be a multiple (checked at encode); a power of two
            for the Hadamard rotation (the parts' sizes instead, with the channel split).
            32 is the original layout.
        rotation: "hadamard" | "haar" = "hadamard" (turbo2.5 / turbo3.5: "haar") —
            (1/sqrt(QK)) D2 H D1 with seeded signs, as upstream's kernels; or a dense Haar-random
            orthogonal matrix (QR of a seeded Gaussian), as upstream's PolarQuant, which the
            channel split uses on each part at the part's own size (no padding).
        codebook: "gaussian" | "beta" | "llamacpp" = "gaussian" — Lloyd-Max for N(0, 1/QK) as
            upstream (N(0, 1/m) for a part of m channels); for the exact coordinate density of a
            random unit vector; or the llama.cpp fork's narrower 4-bit table (only bits=4,
            block=128, no outliers, no qjl).
        norm_correction: bool = True — faithful to TurboQuant+: store gamma / ||c[index]|| so the
            decoded block (each part, with the channel split) has norm gamma. False stores gamma
            itself (the paper's form).
        outlier_fraction: float = 0.0 — in [0, 1): n = round(f * QK) values of each block get one
            more bit; `outlier_split` says which. f = 0.5 gives the 2.5 and 3.5 presets.
        outlier_split: "rotated" | "channels" = "rotated" (turbo2.5 / turbo3.5: "channels") —
            "channels" is upstream's OutlierTurboQuant: the *unrotated* channels of a block are
            split into n outlier channels and QK - n normal ones, and each part is quantized on
            its own: its own norm, its own rotation (seed for the outliers, seed + 500 for the
            rest, as upstream), its own codebook for its own size ((b+1)-bit for the outliers,
            b-bit for the rest), norms stored in float32 (upstream counts 32 bits a norm); with
            qjl the sketch covers the whole block's residual and ||r|| is float32 too. Both parts
            need at least 2 channels. "rotated" is one rotation and one fp16 norm per block with
            the first n *rotated* coordinates at b+1 bits: every rotated coordinate has the same
            law, so it gets about the same distortion for 6 fewer norm bytes, but cannot give
            outlier channels their own scale. Ignored when n = 0.
        outlier_channels: tuple[int, ...] | None = None — channel split only: the outlier
            channels' positions in a block, n distinct values in [0, QK) (order kept, as
            upstream), e.g. `channels_by_magnitude` of calibration keys (upstream's outlier_idx
            and calibrate_outlier_channels). None: the first n channels, upstream's fixed
            fallback and the MLX port's only split. Keys and values share it (one codec).
        qjl: bool = False — the paper's inner-product variant: a (bits-1)-bit MSE stage, then
            signs s = sign(S r) of the block's residual r = x - x_hat_mse with S a seeded Gaussian
            QK x QK matrix, and ||r||; decode adds sqrt(pi/2)/QK * ||r|| * S^T s.
            Unbiased inner products, higher variance (upstream dropped it for that reason).
            Costs one more norm per block: b + f + 32/QK per value (rotated split). ||r|| is
            taken in x's scale, after the rounding of the stored norms, so decode needs no gamma.
            This is upstream's TurboQuant class, the one its README's MSE/cosine rows were run
            with (and, with the channel split, its OutlierTurboQuant).
        seed: int = 0 — rotation seed; the QJL matrix uses seed + 1000 (as upstream), the normal
            part of the channel split seed + 500 (as upstream).
        window: int = 0 — newest tokens kept in full precision by the cache (>= 0).
        impl: "auto" | "torch" | "triton" = "auto" — who encodes and decodes: the torch
            reference, or the Triton kernels (the same bytes; kvbench.kernels); auto: the
            kernels on CUDA where triton is installed. Kernels need the hadamard rotation, no
            qjl, no outliers, block >= 8.
    Tensors: keys and values (batch, kv_heads, tokens, head_dim), the same codec for both.

    Defaults: block=128, hadamard rotation, MSE path as the fork (TheTom/llama-cpp-turboquant
    ggml/src/ggml-common.h: QK_TURBO2/3/4 = 128, TURBO4_USE_4BIT 1); bits=3, norm_correction=True
    as ediestel/turboquant-plus-mlx turboquant/kv_cache.py KVCacheCompressor (k_bits=v_bits=3).
    Differ: seed 0 (upstream Python seed=42, dense Haar rotation; the fork's signs are fixed
    tables) and that KVCacheCompressor codes K with QJL (TurboQuant) and V MSE-only at seed + 500.
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"block": 16}, {"block": 16, "bits": 4, "qjl": True, "window": 8},
        {"block": 16, "rotation": "haar", "codebook": "beta"})

    bits: int = 3
    block: int = 128
    rotation: Literal["hadamard", "haar"] = "hadamard"
    codebook: Literal["gaussian", "beta", "llamacpp"] = "gaussian"
    norm_correction: bool = True
    outlier_fraction: float = 0.0
    outlier_split: Literal["rotated", "channels"] = "rotated"
    outlier_channels: tuple[int, ...] | None = None
    qjl: bool = False
    seed: int = 0
    window: int = 0
    impl: Impl = "auto"

    def __post_init__(self):
        if self.bits not in (2, 3, 4):
            raise ValueError(f"bits must be 2, 3 or 4, got {self.bits!r}")
        if self.block < 2:
            raise ValueError(f"block must be >= 2, got {self.block!r}")
        if self.rotation not in ("hadamard", "haar"):
            raise ValueError(f"rotation must be 'hadamard' or 'haar', got {self.rotation!r}")
        if self.codebook not in ("gaussian", "beta", "llamacpp"):
            raise ValueError(f"codebook must be 'gaussian', 'beta' or 'llamacpp', "
                             f"got {self.codebook!r}")
        if not 0 <= self.outlier_fraction < 1:
            raise ValueError(f"outlier_fraction must be in [0, 1), got {self.outlier_fraction!r}")
        if self.outlier_split not in ("rotated", "channels"):
            raise ValueError(f"outlier_split must be 'rotated' or 'channels', "
                             f"got {self.outlier_split!r}")
        n = round(self.outlier_fraction * self.block)
        split = self.outlier_split == "channels" and n > 0
        if split and not 2 <= n <= self.block - 2:
            raise ValueError(f"outlier_fraction {self.outlier_fraction!r} puts {n} of {self.block}"
                             f" channels in the outlier part with outlier_split 'channels'; "
                             f"each part needs at least 2")
        if self.rotation == "hadamard":
            sizes = (n, self.block - n) if split else (self.block,)
            if any(size & (size - 1) for size in sizes):
                where = (f"parts of {n} and {self.block - n} channels (outlier_split 'channels';"
                         f" upstream uses rotation 'haar')" if split else f"{self.block!r}")
                raise ValueError(f"block must be a power of two for the hadamard rotation, "
                                 f"got {where}")
        if self.outlier_channels is not None:
            self._check_outlier_channels(n, split)
        fits_table = (self.bits, self.block, self.qjl, self.outlier_fraction) == (4, 128, False, 0)
        if self.codebook == "llamacpp" and not fits_table:
            raise ValueError("codebook 'llamacpp' is the fork's 4-bit table for blocks of 128: "
                             "it needs bits=4, block=128, qjl=False, outlier_fraction=0")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window!r}")
        start_impl(self)

    def _check_outlier_channels(self, n: int, split: bool) -> None:
        if not split:
            raise ValueError("outlier_channels needs outlier_split 'channels' and "
                             "outlier_fraction > 0")
        if any(isinstance(c, bool) or not hasattr(c, "__index__") for c in self.outlier_channels):
            raise ValueError(f"outlier_channels must be ints, got {self.outlier_channels!r}")
        channels = tuple(operator.index(c) for c in self.outlier_channels)
        if len(channels) != n:
            raise ValueError(f"outlier_channels must hold round(outlier_fraction * block) = {n} "
                             f"channels, got {len(channels)}")
        if len(set(channels)) != n or not all(0 <= c < self.block for c in channels):
            raise ValueError(f"outlier_channels must be distinct positions in [0, {self.block}),"
                             f" got {self.outlier_channels!r}")
        self.outlier_channels = channels

    def codec(self) -> TurboCodec:
        return run_as(self, TurboCodec(self.bits, self.block, self.rotation, self.codebook,
                                       self.norm_correction, self.outlier_fraction, self.qjl,
                                       self.seed, self.outlier_split, self.outlier_channels))

    def new_layer_cache(self, layer_idx: int) -> CodecCache:
        return CodecCache(self.codec(), self.codec(), window=self.window)


# Presets: TurboQuant+'s cache types at this module's defaults (block 128, MSE path). Its README
# disagrees with itself on their size (benchmark table: turbo3 3.0 bits and 4.6x; cache-type
# table: 3.5 bits and 4.6x; see Turbo for what each layout is). 2.5 and 3.5 follow its
# outlier.py: half the unrotated channels (the first 64 of 128) one bit up, each part with its
# own Haar rotation and float32 norm (its docstring's "32 of 128" is 2.25 bits; its code is 64).


@register_method("turbo2")
@dataclass
class Turbo2(Turbo):
    """turbo preset: 2 bits per coordinate (2.125 bits/value at block 128); the fork's
    block_turbo2_0 (QK_TURBO2 = 128, ggml/src/ggml-common.h)."""

    bits: int = 2


@dataclass
class _ChannelSplit(Turbo):
    """The outlier presets' shared settings: upstream outlier.py's split of the channels."""

    outlier_fraction: float = 0.5
    outlier_split: Literal["rotated", "channels"] = "channels"
    rotation: Literal["hadamard", "haar"] = "haar"


@register_method("turbo2.5")
@dataclass
class Turbo2_5(_ChannelSplit):
    """turbo preset: upstream's channel split, the first half of each block's channels at 3 bits
    and the rest at 2, each half with its own Haar rotation and fp32 norm (3.0 bits/value at
    block 128; outlier_split="rotated" gives 2.625). Upstream: turboquant/outlier.py
    OutlierTurboQuant (TheTom/turboquant_plus), target_bits=2.5, with QJL (qjl=True here)."""

    bits: int = 2


@register_method("turbo3")
@dataclass
class Turbo3(Turbo):
    """turbo preset: 3 bits per coordinate (3.125 bits/value at block 128); the fork's
    block_turbo3_0 (QK_TURBO3 = 128, ggml/src/ggml-common.h)."""

    bits: int = 3


@register_method("turbo3.5")
@dataclass
class Turbo3_5(_ChannelSplit):
    """turbo preset: upstream's channel split, the first half of each block's channels at 4 bits
    and the rest at 3, each half with its own Haar rotation and fp32 norm (4.0 bits/value at
    block 128; outlier_split="rotated" gives 3.625). Upstream: turboquant/outlier.py
    OutlierTurboQuant (TheTom/turboquant_plus), target_bits=3.5, with QJL (qjl=True here)."""

    bits: int = 3


@register_method("turbo4")
@dataclass
class Turbo4(Turbo):
    """turbo preset: 4 bits per coordinate (4.125 bits/value at block 128); the fork's default
    block_turbo4_0 (TURBO4_USE_4BIT 1: 4-bit MSE, 66 bytes per 128, ggml/src/ggml-common.h)."""

    bits: int = 4
