"""`turbo` and presets turbo2, turbo2.5, turbo3, turbo3.5, turbo4: TurboQuant / PolarQuant."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import SettingError, at_least, between, one_of, param
from kvbench.kernels.formats import turbo_unsupported
from kvbench.methods.settings.base import (
    IMPL_MEANING, Impl, KernelSettings, MethodSettings, register_method,
)
from kvbench.methods.settings.codec_policy import CodecPolicy, layers_param, sinks_param

# The meanings the presets declare again with their own defaults.
BITS = "bits per coordinate, counting the QJL bit when qjl is on"
ROTATION = ("hadamard: (1/sqrt(QK)) D2 H D1 with seeded signs, as upstream's kernels; haar: a"
            " dense Haar-random orthogonal matrix (QR of a seeded Gaussian), as upstream's"
            " PolarQuant, which the channel split uses on each part at the part's own size (no"
            " padding)")
OUTLIER_FRACTION = ("n = round(f * QK) values of each block get one more bit; `outlier_split`"
                    " says which. f = 0.5 gives the 2.5 and 3.5 presets")
OUTLIER_SPLIT = (
    "channels is upstream's OutlierTurboQuant: the *unrotated* channels of a block are split"
    " into n outlier channels and QK - n normal ones, and each part is quantized on its own: its"
    " own norm, its own rotation (seed for the outliers, seed + 500 for the rest, as upstream),"
    " its own codebook for its own size ((b+1)-bit for the outliers, b-bit for the rest), norms"
    " stored in float32 (upstream counts 32 bits a norm); with qjl the sketch covers the whole"
    " block's residual and ||r|| is float32 too. Both parts need at least 2 channels. rotated is"
    " one rotation and one fp16 norm per block with the first n *rotated* coordinates at b+1"
    " bits: every rotated coordinate has the same law, so it gets about the same distortion for"
    " 6 fewer norm bytes, but cannot give outlier channels their own scale. Ignored when n = 0")


def bits_param(default: int):
    """turbo's `bits`, at the default of the class declaring it (turbo's own, or a preset's)."""
    return param(default, range=one_of(2, 3, 4), meaning=BITS)


@register_method("turbo")
@dataclass
class Turbo(CodecPolicy, KernelSettings, MethodSettings):
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

    Tensors: keys and values (batch, kv_heads, tokens, head_dim), the same codec for both.

    Defaults: block=128, hadamard rotation, MSE path as the fork (TheTom/llama-cpp-turboquant
    ggml/src/ggml-common.h: QK_TURBO2/3/4 = 128, TURBO4_USE_4BIT 1); bits=3, norm_correction=True
    as ediestel/turboquant-plus-mlx turboquant/kv_cache.py KVCacheCompressor (k_bits=v_bits=3).
    Differ: seed 0 (upstream Python seed=42, dense Haar rotation; the fork's signs are fixed
    tables) and that KVCacheCompressor codes K with QJL (TurboQuant) and V MSE-only at seed + 500.
    """

    # reports/ruler (CPU, one thread): 1.47x identity's time on the same 22 cases
    relative_cost: ClassVar[float] = 1.5

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.turbo",
        "mlx": "kvbench.methods.mlx.turbo",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"block": 16}, {"block": 16, "bits": 4, "qjl": True, "window": 8},
        {"block": 16, "rotation": "haar", "codebook": "beta"})

    bits: int = bits_param(3)
    block: int = param(128, range=at_least(2), rule="a power of two for the hadamard rotation",
                       meaning="QK; head_dim must be a multiple (checked at encode); a power of"
                       " two for the Hadamard rotation (the parts' sizes instead, with the"
                       " channel split). 32 is the original layout")
    rotation: Literal["hadamard", "haar"] = param("hadamard", meaning=ROTATION)
    codebook: Literal["gaussian", "beta", "llamacpp"] = param(
        "gaussian", meaning="Lloyd-Max for N(0, 1/QK) as upstream (N(0, 1/m) for a part of m"
        " channels); for the exact coordinate density of a random unit vector; or the llama.cpp"
        " fork's narrower 4-bit table (only bits=4, block=128, no outliers, no qjl)")
    norm_correction: bool = param(
        True, meaning="faithful to TurboQuant+: store gamma / ||c[index]|| so the decoded block"
        " (each part, with the channel split) has norm gamma. False stores gamma itself (the"
        " paper's form)")
    outlier_fraction: float = param(0.0, range=between(0, 1, high_open=True),
                                    meaning=OUTLIER_FRACTION)
    outlier_split: Literal["rotated", "channels"] = param("rotated", meaning=OUTLIER_SPLIT)
    outlier_channels: tuple[int, ...] | None = param(
        None, rule="distinct positions in [0, block)",
        meaning="channel split only: the outlier channels' positions in a block, n distinct"
        " values (order kept, as upstream), e.g. `channels_by_magnitude` of calibration keys"
        " (upstream's outlier_idx and calibrate_outlier_channels). None: the first n channels,"
        " upstream's fixed fallback and the MLX port's only split. Keys and values share it")
    qjl: bool = param(
        False, meaning="the paper's inner-product variant: a (bits-1)-bit MSE stage, then signs"
        " s = sign(S r) of the block's residual r = x - x_hat_mse with S a seeded Gaussian"
        " QK x QK matrix, and ||r||; decode adds sqrt(pi/2)/QK * ||r|| * S^T s. Unbiased inner"
        " products, higher variance (upstream dropped it for that reason). Costs one more norm"
        " per block: b + f + 32/QK per value (rotated split). ||r|| is taken in x's scale, after"
        " the rounding of the stored norms, so decode needs no gamma. This is upstream's"
        " TurboQuant class, the one its README's MSE/cosine rows were run with (and, with the"
        " channel split, its OutlierTurboQuant)")
    seed: int = param(0, meaning="rotation seed; the QJL matrix uses seed + 1000 (as upstream),"
                      " the normal part of the channel split seed + 500 (as upstream)")
    window: int = param(0, range=at_least(0),
                        meaning="newest tokens kept in full precision by the cache")
    sinks: int | None = sinks_param()
    layers: Literal["all", "full"] | None = layers_param()
    impl: Impl = param("auto", meaning=IMPL_MEANING + ". Kernels need the hadamard rotation,"
                       " no qjl, no outliers, block >= 8")

    @property
    def outliers(self) -> int:
        """n: the values of each block that get one more bit."""
        return round(self.outlier_fraction * self.block)

    @property
    def channel_split(self) -> bool:
        return self.outlier_split == "channels" and self.outliers > 0

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim % self.block:
            raise SettingError("block", f"block {self.block} does not divide head_dim"
                               f" {head_dim}: set block to a divisor of it (e.g. {head_dim})")

    def check(self) -> None:
        n, split = self.outliers, self.channel_split
        if split and not 2 <= n <= self.block - 2:
            raise SettingError("outlier_fraction", f"outlier_fraction {self.outlier_fraction!r}"
                               f" puts {n} of {self.block} channels in the outlier part with"
                               " outlier_split 'channels'; each part needs at least 2")
        if self.rotation == "hadamard":
            sizes = (n, self.block - n) if split else (self.block,)
            if any(size & (size - 1) for size in sizes):
                where = (f"parts of {n} and {self.block - n} channels (outlier_split 'channels';"
                         f" upstream uses rotation 'haar')" if split else f"{self.block!r}")
                raise SettingError("block", f"block must be a power of two for the hadamard"
                                            f" rotation, got {where}")
        if self.outlier_channels is not None:
            self._check_outlier_channels(n, split)
        fits_table = (self.bits, self.block, self.qjl, self.outlier_fraction) == (4, 128, False, 0)
        if self.codebook == "llamacpp" and not fits_table:
            raise SettingError("codebook", "codebook 'llamacpp' is the fork's 4-bit table for"
                               " blocks of 128: it needs bits=4, block=128, qjl=False,"
                               " outlier_fraction=0")
        self.check_impl()

    def _check_outlier_channels(self, n: int, split: bool) -> None:
        field = "outlier_channels"
        if not split:
            raise SettingError(field, "outlier_channels needs outlier_split 'channels' and "
                                      "outlier_fraction > 0")
        if any(isinstance(c, bool) or not hasattr(c, "__index__") for c in self.outlier_channels):
            raise SettingError(field, f"outlier_channels must be ints, got"
                                      f" {self.outlier_channels!r}")
        channels = tuple(operator.index(c) for c in self.outlier_channels)
        if len(channels) != n:
            raise SettingError(field, f"outlier_channels must hold round(outlier_fraction *"
                                      f" block) = {n} channels, got {len(channels)}")
        if len(set(channels)) != n or not all(0 <= c < self.block for c in channels):
            raise SettingError(field, f"outlier_channels must be distinct positions in"
                                      f" [0, {self.block}), got {self.outlier_channels!r}")
        self.outlier_channels = channels

    def token_block(self) -> int:
        return 1

    def kernel_unsupported(self) -> str | None:
        return turbo_unsupported(self.qjl, self.outliers, self.rotation)

    def kernel_fields(self) -> tuple[str, ...]:
        # in turbo_unsupported's order: the first of them that keeps the kernel away
        return ("qjl",) if self.qjl else ("outlier_fraction",) if self.outliers else ("rotation",)


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

    bits: int = bits_param(2)


@dataclass
class _ChannelSplit(Turbo):
    """The outlier presets' shared settings: upstream's split of the channels, turboquant/outlier.py
    OutlierTurboQuant (TheTom/turboquant_plus), with QJL (qjl=True here)."""

    outlier_fraction: float = param(0.5, range=between(0, 1, high_open=True),
                                    meaning=OUTLIER_FRACTION)
    outlier_split: Literal["rotated", "channels"] = param("channels", meaning=OUTLIER_SPLIT)
    rotation: Literal["hadamard", "haar"] = param("haar", meaning=ROTATION)


@register_method("turbo2.5")
@dataclass
class Turbo2_5(_ChannelSplit):
    """turbo preset: upstream's channel split, the first half of each block's channels at 3 bits
    and the rest at 2, each half with its own Haar rotation and fp32 norm (3.0 bits/value at
    block 128; outlier_split="rotated" gives 2.625). Upstream: target_bits=2.5."""

    bits: int = bits_param(2)


@register_method("turbo3")
@dataclass
class Turbo3(Turbo):
    """turbo preset: 3 bits per coordinate (3.125 bits/value at block 128); the fork's
    block_turbo3_0 (QK_TURBO3 = 128, ggml/src/ggml-common.h)."""

    bits: int = bits_param(3)


@register_method("turbo3.5")
@dataclass
class Turbo3_5(_ChannelSplit):
    """turbo preset: upstream's channel split, the first half of each block's channels at 4 bits
    and the rest at 3, each half with its own Haar rotation and fp32 norm (4.0 bits/value at
    block 128; outlier_split="rotated" gives 3.625). Upstream: target_bits=3.5."""

    bits: int = bits_param(3)


@register_method("turbo4")
@dataclass
class Turbo4(Turbo):
    """turbo preset: 4 bits per coordinate (4.125 bits/value at block 128); the fork's default
    block_turbo4_0 (TURBO4_USE_4BIT 1: 4-bit MSE, 66 bytes per 128, ggml/src/ggml-common.h)."""

    bits: int = bits_param(4)
