"""The packed layouts the kernels read and write, described by the codecs that own them.

A codec hands its kernel format to kvbench.kernels.triton; the kernels never import a method.
Torch-free at import: a method's settings ask a format why it has no kernel.
Each format's `unsupported()` says why a configuration has no kernel (None: it has one).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

CODEBOOK_KINDS = ("lloydmax", "turbo")


# The bit packing every layout shares (kvbench.methods.torch.packing, its MLX twin and the
# kernels): code i of a row occupies bits [i*b, (i+1)*b) of the row's little-endian bit stream
# (bit k of the stream is bit k % 8 of byte k // 8), so any 8 consecutive codes fill b bytes.

def packed_length(n: int, bits: int) -> int:
    """Bytes that n codes of `bits` bits take: ceil(n * bits / 8)."""
    return (n * bits + 7) // 8


def check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")


def check_packed(width: int, n: int, bits: int) -> None:
    """Refuses packed rows of `width` bytes that do not hold exactly n codes of `bits` bits."""
    check_bits(bits)
    if width != packed_length(n, bits):
        raise ValueError(f"{n} codes of {bits} bits take {packed_length(n, bits)} bytes, got"
                         f" {width}")


def code_slots(bits: int):
    """For each code slot j of a group of 8: its first byte, its bit offset there, and whether
    it spills into the next byte."""
    for j in range(8):
        byte, shift = divmod(j * bits, 8)
        yield j, byte, shift, shift + bits > 8


@dataclass(frozen=True)
class IntQFormat:
    """intq's layout (kvbench.methods.torch.intq.IntQCodec and its MLX twin): per group of
    `group_size` values along a row, fp16 scale and min and `bits`-bit codes; rows are tokens
    (axis "token") or channels (axis "channel"). Made once, by the settings (IntQ.format(),
    Kivi.key_format() and value_format()), and held by the codecs and the kernels."""

    bits: int
    group_size: int
    axis: Literal["token", "channel"]

    def unsupported(self) -> str | None:
        if self.group_size & (self.group_size - 1):
            return f"group_size {self.group_size} is not a power of two"
        if self.group_size * self.bits < 8:
            return f"a group of {self.group_size} {self.bits}-bit codes fills less than a byte"
        return None

    @property
    def token_block(self) -> int:
        """Tokens that must be packed together: whole groups of them on the channel axis."""
        return self.group_size if self.axis == "channel" else 1

    def attention_unsupported(self) -> str | None:
        """Why the (Triton) fused decode attention cannot read this layout (None: it can)."""
        if self.axis != "token":
            return "keys quantized per channel over tokens"
        return self.unsupported()

    def cpu_attention_unsupported(self, dim: int) -> str | None:
        """Why the CPU fused decode attention cannot read rows of `dim` values (None: it can):
        it unpacks 8 codes at a time, each 8 under one scale; per channel, whole groups."""
        if self.group_size % 8:
            return f"group_size {self.group_size} is not a multiple of 8"
        if self.axis == "token" and dim % 8:
            return f"head_dim {dim} is not a multiple of 8"
        return self.unsupported()

    def stored_tokens(self, name: str, tokens: int) -> int:
        """Entries along the last axis of the stored tensor `name` that hold `tokens` tokens of a
        channel row (whole groups: bytes of codes, or scales and mins)."""
        groups = -(-tokens // self.group_size)
        return groups * self.group_size * self.bits // 8 if name == "codes" else groups

    def merge_axis(self, shapes: list[tuple[int, ...]]) -> int | None:
        """The stored arrays' axis that packs of these shapes join along, or None where they
        cannot join."""
        if self.axis == "token":
            return -2  # rows are tokens: blocks stack
        if all(s[-2] % self.group_size == 0 and s[-2] * self.bits % 8 == 0 for s in shapes[:-1]):
            return -1  # rows are channels: whole groups and whole bytes join end to end
        return None

    def stacking_axis(self, ndim: int) -> int | None:
        """The axis of a pack's stored arrays that its tokens run along (None: they span rows)."""
        return ndim - 2 if self.axis == "token" else None

    def describe(self) -> str:
        along = "channels per token" if self.axis == "token" else "tokens per channel"
        return (f"intq {self.bits}-bit, groups of {self.group_size} {along} (axis {self.axis}), "
                f"fp16 scale+min per group")


@dataclass(eq=False)
class CodebookFormat:
    """Rows of `block` values, each stored as one norm and one `bits`-bit code per value
    (kvbench.methods.lloydmax and kvbench.methods.turbo):

    - lloydmax: a row is a whole vector; codes of x / max(||x||, tiny) * scale (scale =
      sqrt(D)); the norm ||x|| is stored; decode c / scale * norm.
    - turbo: a row is a block; codes of d2 * H(d1 * x / ||x||) / scale (scale = sqrt(block),
      H the Walsh-Hadamard butterflies); the norm ||x|| / ||c|| (norm_correction) or ||x|| is
      stored; decode d1 * H(d2 * c) / scale * norm.

    centroids, bounds: float32 on the CPU, bounds as Codebook.float32_bounds (a code counts the
    bounds below the value); signs: (d1, d2) float64 for turbo. Norms and sums of squares use
    the pairwise order of kvbench.methods.rounding.
    """

    kind: Literal["lloydmax", "turbo"]
    bits: int
    block: int
    centroids: torch.Tensor
    bounds: torch.Tensor
    norm_dtype: torch.dtype
    norm_name: str
    scale: float
    signs: tuple[torch.Tensor, torch.Tensor] | None = None
    norm_correction: bool = False
    _on_device: dict = field(default_factory=dict, repr=False)

    def unsupported(self) -> str | None:
        if self.block < 8:
            return f"rows of {self.block} values (the kernels pack whole groups of 8 codes)"
        return None

    def attention_unsupported(self) -> str | None:
        if self.kind == "turbo" or self.block % 8 == 0:
            return self.unsupported()
        return f"rows of {self.block} values, not whole groups of 8 codes"

    def cpu_attention_unsupported(self, dim: int) -> str | None:
        """Why the CPU fused decode attention cannot read rows of `dim` values (None: it can)."""
        if dim % 8:
            return f"head_dim {dim} is not a multiple of 8"
        if self.block % 8:
            return f"rows of {self.block} values, not whole groups of 8 codes"
        return None

    @functools.cached_property
    def scale32(self) -> float:
        """`scale` rounded to float32, as the torch codecs and the kernels use it."""
        return float(np.float32(self.scale))

    def tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(centroids, bounds, d1, d2) as float32 on `device`; d1 and d2 are ones without a
        rotation. Made once per device."""
        import torch

        key = str(device)
        if key not in self._on_device:
            ones = torch.ones(self.block, dtype=torch.float64)
            d1, d2 = self.signs or (ones, ones)
            self._on_device[key] = tuple(t.to(device, torch.float32).contiguous() for t in
                                         (self.centroids, self.bounds, d1, d2))
        return self._on_device[key]


KernelFormat = IntQFormat | CodebookFormat


def lloydmax_unsupported(rotate: bool) -> str | None:
    """Why a lloydmax layout has no kernel (None: it has one, for head_dim >= 8)."""
    if rotate:
        return "rotate: a dense rotation is a matrix product, rounded as the BLAS rounds it"
    return None


def turbo_unsupported(qjl: bool, outliers: int, rotation: str) -> str | None:
    """Why a turbo layout has no kernel (None: it has one, for blocks >= 8)."""
    if qjl:
        return "qjl: its sketch is a dense matrix product"
    if outliers:
        return "outlier_fraction > 0"
    if rotation != "hadamard":
        return "rotation 'haar': a dense matrix product, rounded as the BLAS rounds it"
    return None


@dataclass
class KVSegment:
    """Consecutive tokens of one layer's cache, as the fused decode attention reads them: keys
    and values each a raw tensor (batch, kv_heads, tokens, head_dim), or the stored tensors of
    a packed layout with its format (None for raw). `length`: only the first so many tokens
    count (None: all); head() sets it rather than cutting the tensors."""

    keys: torch.Tensor | dict[str, torch.Tensor]
    values: torch.Tensor | dict[str, torch.Tensor]
    key_format: KernelFormat | None = None
    value_format: KernelFormat | None = None
    length: int | None = None

    @property
    def tokens(self) -> int:
        if self.length is not None:
            return self.length
        if self.key_format is None:
            return self.keys.shape[-2]
        codes = self.keys["codes"]
        if is_channel(self.key_format):  # whole bytes: a partial one has its length set
            return codes.shape[-1] * 8 // self.key_format.bits
        return codes.shape[token_axis(self.key_format, "codes")]

    def head(self, tokens: int) -> KVSegment:
        """Its first `tokens` tokens."""
        return dataclasses.replace(self, length=tokens)

    def trimmed(self) -> KVSegment:
        """The same tokens with tensors of exactly them (views; a channel layout's whole groups
        of them, its length kept): for readers that count tokens by the tensors' shapes."""
        if self.length is None:
            return self
        tokens = self.length

        def cut(side, fmt):
            if fmt is None:
                return side[..., :tokens, :]
            if is_channel(fmt):
                return {name: t[..., :fmt.stored_tokens(name, tokens)]
                        for name, t in side.items()}
            return {name: t.narrow(token_axis(fmt, name), 0, tokens) for name, t in side.items()}

        return KVSegment(cut(self.keys, self.key_format), cut(self.values, self.value_format),
                         self.key_format, self.value_format, length=tokens)


def is_channel(fmt: KernelFormat | None) -> bool:
    """Whether fmt stores rows of channels over tokens (intq axis "channel"): no tensor of it
    has a token axis."""
    return isinstance(fmt, IntQFormat) and fmt.axis == "channel"


def is_turbo(fmt: KernelFormat | None) -> bool:
    """Whether fmt is turbo's layout (rows stored rotated, codes per block)."""
    return isinstance(fmt, CodebookFormat) and fmt.kind == "turbo"


def token_axis(fmt: KernelFormat, name: str) -> int:
    """The token axis of a packed layout's stored tensor `name` (turbo's codes are (..., tokens,
    blocks, bytes); every other tensor of a per-token layout has tokens second last)."""
    return -3 if is_turbo(fmt) and name == "codes" else -2


@dataclass
class PackedRead:
    """A layer's cache as a fused decode attention reads it: its segments in token order and the
    kernel that reads them ("triton" or "cpu")."""

    kernel: Literal["triton", "cpu"]
    segments: list[KVSegment]

    @property
    def tokens(self) -> int:
        return sum(segment.tokens for segment in self.segments)


def check_decode_shapes(segments: list[KVSegment], batch: int, q_heads: int,
                        bias) -> tuple[int, int]:
    """(kv_heads, tokens) of a decode attention's segments; ValueError for no segment, query
    heads that do not share the KV heads evenly, or a bias not (batch, kv_heads, tokens)."""
    if not segments:
        raise ValueError("decode_attention needs at least one segment")
    first = segments[0]
    kv_heads = (first.keys if first.key_format is None else first.keys["codes"]).shape[1]
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not share {kv_heads} KV heads evenly")
    total = sum(s.tokens for s in segments)
    if bias is not None and tuple(bias.shape) != (batch, kv_heads, total):
        raise ValueError(f"bias must be (batch, kv_heads, tokens) = "
                         f"{(batch, kv_heads, total)}, got {tuple(bias.shape)}")
    return kv_heads, total
