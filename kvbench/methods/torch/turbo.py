"""`turbo` and its presets on torch: TurboQuant / PolarQuant (kvbench.methods.settings.turbo)."""
from __future__ import annotations

import math

import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.kernels.formats import CodebookFormat, turbo_unsupported
from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.core.turbo_steps import TurboSteps
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.turbo import Turbo, Turbo2, Turbo2_5, Turbo3, Turbo3_5, Turbo4
from kvbench.methods.torch.codebooks import Codebook, gaussian_moments, lloyd_max
from kvbench.methods.torch.packing import pack_bits, unpack_bits
from kvbench.methods.torch.rotation import HaarRotation, SignedHadamard, make_rotation
from kvbench.methods.torch.rounding import pairwise_norm
from kvbench.methods.torch.tokenwise import TokenwiseCodec

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


class Part:
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


class TurboCodec(TurboSteps, TokenwiseCodec):
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

    @property
    def chunk_separable(self) -> bool:
        """With the Hadamard rotation and no QJL, decode is elementwise (unpack, codebook lookup,
        butterflies row by row, times the norm), so a chunk decodes alone as inside the merged
        block (kvbench.methods.core.contracts.Codec.chunk_separable). The Haar rotation and the
        QJL matrix are matrix products, whose kernel, and so whose rounding, can change with the
        rows decoded at once (the CPU BLAS switches kernels below 4 rows). The MLX twin decodes
        by products either way."""
        return self.rotation_kind == "hadamard" and not self.qjl

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
                Part(outliers, make_rotation(rotation, self.n_high, seed), self.n_high,
                      None, self._codebook(b + 1, self.n_high), "norm_high"),
                Part(normal, make_rotation(rotation, n_low, seed + NORMAL_PART_SEED_OFFSET), 0,
                      self._codebook(b, n_low), None, "norm"),
            ]
        else:
            self.norm_dtype = torch.float16
            high = self._codebook(b + 1, block) if self.n_high else None
            self.parts = [Part(None, make_rotation(rotation, block, seed), self.n_high,
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

    # ---- what TurboSteps takes from the backend
    arrays = TORCH_ARRAYS
    norm = staticmethod(pairwise_norm)
    pack, unpack = staticmethod(pack_bits), staticmethod(unpack_bits)

    def assemble(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if len(parts) == 1 and self.parts[0].channels is None:
            return parts[0]
        out = parts[0].new_empty((*parts[0].shape[:-1], self.block))
        for part, values in zip(self.parts, parts):
            out.index_copy_(-1, part.channels.to(out.device), values)
        return out

    def sketch(self, residual: torch.Tensor) -> torch.Tensor:
        return residual @ self.qjl_matrix.T.to(residual.device, torch.float32)

    def unsketch(self, signs: torch.Tensor) -> torch.Tensor:
        return signs @ self.qjl_matrix.to(signs.device, torch.float32)

    def kernel_unsupported(self) -> str | None:
        return turbo_unsupported(self.qjl, self.n_high, self.rotation_kind)

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


@implements(Turbo, Turbo2, Turbo2_5, Turbo3, Turbo3_5, Turbo4)
class TorchTurbo(CodecMethod):
    """Turbo and its presets (turbo2, turbo2.5, turbo3, turbo3.5, turbo4) on torch."""

    settings: Turbo

    def codec(self) -> TurboCodec:
        s = self.settings
        return self.run_as(TurboCodec(s.bits, s.block, s.rotation, s.codebook, s.norm_correction,
                                      s.outlier_fraction, s.qjl, s.seed, s.outlier_split,
                                      s.outlier_channels))
