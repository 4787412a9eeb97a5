"""`intq` on MLX: asymmetric per-group integer quantization, fp16 scale and min
(kvbench.methods.settings.intq)."""
from __future__ import annotations

import mlx.core as mx

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.kernels.formats import IntQFormat
from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.core.contracts import Codec, Packed
from kvbench.methods.mlx.packing import pack_bits, unpack_bits
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.intq import IntQ


class MLXIntQCodec(Codec):
    """IntQCodec on mx.array: per group fp16 scale = (max - min) / (2^bits - 1), fp16 min,
    q = round((x - min) / scale) with the stored fp16 values, each row packed on its own.

    Rows: axis "token", one token's head_dim channels; axis "channel", one channel over the tokens
    given (token_block = group_size). A trailing partial group has its own scale and min.
    Stored tensors, as torch: codes uint8 (..., rows, ceil(L * bits / 8)), scale and min float16
    (..., rows, ceil(L / group_size)), rows = tokens (token) or head_dim (channel). Built from
    its format (MLXIntQCodec(fmt)), whence its token_block, merge, stacking_axis and layout
    (kvbench.methods.core.contracts.Codec).
    """

    arrays = MLX_ARRAYS
    format: IntQFormat

    # decode is elementwise per stored value (unpack, multiply, add): decoding chunk by chunk
    # rounds exactly as decoding them merged (kvbench.methods.core.contracts.Codec.chunk_separable)
    chunk_separable = True

    def encode(self, x: mx.array) -> Packed:
        rows = x if self.format.axis == "token" else mx.swapaxes(x, -1, -2)
        codes, scale, zero = self._encode_rows(rows)
        return Packed({"codes": codes, "scale": scale, "min": zero}, tuple(x.shape), x.dtype)

    def _encode_rows(self, rows: mx.array):
        lead, length = rows.shape[:-1], rows.shape[-1]
        groups = -(-length // self.format.group_size)
        extra = groups * self.format.group_size - length
        work = rows.astype(mx.float32)
        if extra:
            # Repeating a row's last value leaves its partial group's min and max as they are.
            work = mx.pad(work, [(0, 0)] * (work.ndim - 1) + [(0, extra)], mode="edge")
        grouped = work.reshape(*lead, groups, self.format.group_size)
        lo, hi = grouped.min(axis=-1), grouped.max(axis=-1)
        levels = (1 << self.format.bits) - 1
        scale, zero = ((hi - lo) / levels).astype(mx.float16), lo.astype(mx.float16)
        # Quantize with the stored fp16 values so decode reproduces exactly what encode chose.
        divisor = mx.where(scale == 0, 1.0, scale.astype(mx.float32))
        q = mx.round((grouped - zero.astype(mx.float32)[..., None]) / divisor[..., None])
        q = mx.clip(q, 0, levels).reshape(*lead, groups * self.format.group_size)[..., :length]
        return pack_bits(q.astype(mx.uint8), self.format.bits), scale, zero

    def decode(self, packed: Packed) -> mx.array:
        codes, scale, zero = (packed.tensors[k] for k in ("codes", "scale", "min"))
        tokens, dim = packed.shape[-2], packed.shape[-1]
        length = dim if self.format.axis == "token" else tokens
        lead, groups = codes.shape[:-1], scale.shape[-1]
        values = unpack_bits(codes, self.format.bits, length).astype(mx.float32)
        extra = groups * self.format.group_size - length
        if extra:
            values = mx.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, extra)])
        grouped = values.reshape(*lead, groups, self.format.group_size)
        # Two roundings, multiply then add, as torch's mul_ then add_ (no fused multiply-add).
        grouped = grouped * scale.astype(mx.float32)[..., None]
        grouped = grouped + zero.astype(mx.float32)[..., None]
        rows = grouped.reshape(*lead, groups * self.format.group_size)[..., :length]
        out = rows if self.format.axis == "token" else mx.swapaxes(rows, -1, -2)
        return out.astype(packed.dtype)


@implements(IntQ, backend="mlx")
class MLXIntQ(CodecMethod):
    settings: IntQ

    def codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.settings.format())
