"""`intq`: plain asymmetric per-group integer quantization with fp16 scale and min."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from kvbench.methods.base import Codec, Method, Packed, register_method
from kvbench.methods.codec_cache import CodecCache
from kvbench.methods.packing import pack_bits, unpack_bits


class IntQCodec(Codec):
    """Per group: fp16 scale = (max - min) / (2^bits - 1), fp16 min, q = round((x - min) / scale).

    Groups run along rows: with axis "token" a row is one token's head_dim channels, with axis
    "channel" a row is one channel over the tokens given (so whole groups need token_block tokens).
    A trailing partial group has its own scale and min. Each row's codes are packed on their own,
    ceil(row_length * bits / 8) bytes.

    Stored tensors: codes uint8 (..., rows, ceil(L * bits / 8)), scale and min float16
    (..., rows, ceil(L / group_size)), with L the row length.
    """

    def __init__(self, bits: int, group_size: int, axis: str):
        self.bits = bits
        self.group_size = group_size
        self.axis = axis
        self.token_block = group_size if axis == "channel" else 1

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2) if self.axis == "channel" else x

    def _grouped(self, rows: torch.Tensor, pad_value: float) -> torch.Tensor:
        groups = -(-rows.shape[-1] // self.group_size)
        padded = F.pad(rows, (0, groups * self.group_size - rows.shape[-1]), value=pad_value)
        return padded.unflatten(-1, (groups, self.group_size))

    def encode(self, x: torch.Tensor) -> Packed:
        rows = self._rows(x).float()
        # +-inf padding leaves each partial group's min and max to its real values.
        lo = self._grouped(rows, math.inf).amin(-1)
        hi = self._grouped(rows, -math.inf).amax(-1)
        levels = (1 << self.bits) - 1
        scale, zero = ((hi - lo) / levels).half(), lo.half()
        # Quantize with the stored fp16 values so decode reproduces exactly what encode chose.
        divisor = torch.where(scale == 0, 1.0, scale.float())[..., None]
        q = ((self._grouped(rows, 0.0) - zero.float()[..., None]) / divisor).round()
        codes = q.clamp(0, levels).to(torch.uint8).flatten(-2)[..., : rows.shape[-1]]
        return Packed(
            {"codes": pack_bits(codes, self.bits), "scale": scale, "min": zero},
            tuple(x.shape),
            x.dtype,
        )

    def decode(self, packed: Packed) -> torch.Tensor:
        length = packed.shape[-2] if self.axis == "channel" else packed.shape[-1]
        codes = unpack_bits(packed.tensors["codes"], self.bits, length).float()
        scale = packed.tensors["scale"].float()[..., None]
        zero = packed.tensors["min"].float()[..., None]
        rows = (self._grouped(codes, 0.0) * scale + zero).flatten(-2)[..., :length]
        return self._rows(rows).to(packed.dtype)

    def merge(self, parts: list[Packed]) -> Packed | None:
        if self.axis == "token":
            dim = -2  # rows are tokens: blocks stack
        elif all(p.shape[-2] % self.group_size == 0 and p.shape[-2] * self.bits % 8 == 0
                 for p in parts[:-1]):
            dim = -1  # rows are channels: whole groups and whole bytes join end to end
        else:
            return None
        tensors = {name: torch.cat([p.tensors[name] for p in parts], dim) for name in parts[0].tensors}
        tokens = sum(p.shape[-2] for p in parts)
        return Packed(tensors, (*parts[0].shape[:-2], tokens, parts[0].shape[-1]), parts[0].dtype)

    def layout(self) -> str:
        along = "channels per token" if self.axis == "token" else "tokens per channel"
        return (
            f"intq {self.bits}-bit, groups of {self.group_size} {along} (axis {self.axis}), "
            f"fp16 scale+min per group"
        )


@register_method("intq")
@dataclass
class IntQ(Method):
    """Asymmetric per-group integer quantization of keys and values, the same codec for both.

    Scheme: per group of `group_size` values, min and max give scale = (max - min) / (2^bits - 1);
    scale and min are stored in float16; q = clamp(round((x - min) / scale), 0, 2^bits - 1), packed
    at `bits` bits. Bits per quantized value: bits + 32 / group_size. The newest `window` tokens
    stay in full precision and count at their dtype.

    Parameters:
        bits: int = 4 — 2, 4 or 8.
        group_size: int = 32 — values per group (>= 1).
        axis: "token" | "channel" = "token" — token: each token's head_dim channels are split into
            groups (a trailing partial group has its own scale); channel: each channel is grouped
            over group_size consecutive tokens, so the cache quantizes whole blocks of that many.
        window: int = 0 — newest tokens kept in full precision (>= 0).
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).
    """

    bits: int = 4
    group_size: int = 32
    axis: Literal["token", "channel"] = "token"
    window: int = 0

    def __post_init__(self):
        if self.bits not in (2, 4, 8):
            raise ValueError(f"bits must be 2, 4 or 8, got {self.bits!r}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size!r}")
        if self.axis not in ("token", "channel"):
            raise ValueError(f"axis must be 'token' or 'channel', got {self.axis!r}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window!r}")

    def codec(self) -> IntQCodec:
        return IntQCodec(self.bits, self.group_size, self.axis)

    def new_layer_cache(self, layer_idx: int) -> CodecCache:
        return CodecCache(self.codec(), self.codec(), window=self.window)
