"""`intq` on torch: asymmetric per-group integer quantization with fp16 scale and min
(kvbench.methods.settings.intq)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.kernels.formats import IntQFormat, packed_length
from kvbench.methods.core.codec_cache import CodecMethod
from kvbench.methods.core.contracts import Packed
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.intq import IntQ
from kvbench.methods.torch.base import KernelCodec
from kvbench.methods.torch.packing import pack_bits, unpack_bits
from kvbench.methods.torch.rounding import divide

# Rows quantized at a time: a block's float32 temporaries stay in cache and are reused, where
# whole-tensor temporaries would each be written to fresh memory (most of the encode time).
ROWS_PER_BLOCK = 8192


class IntQCodec(KernelCodec):
    """Per group: fp16 scale = (max - min) / (2^bits - 1), fp16 min, q = round((x - min) / scale).

    Groups run along rows: with axis "token" a row is one token's head_dim channels, with axis
    "channel" a row is one channel over the tokens given (so whole groups need token_block tokens).
    A trailing partial group has its own scale and min. Each row's codes are packed on their own,
    ceil(row_length * bits / 8) bytes.

    Stored tensors: codes uint8 (..., rows, ceil(L * bits / 8)), scale and min float16
    (..., rows, ceil(L / group_size)), with L the row length. Built from its format
    (IntQCodec(fmt)), whence its token_block, merge, stacking_axis and layout
    (kvbench.methods.core.contracts.Codec).
    """

    format: IntQFormat

    # decode is elementwise per stored value (unpack, multiply, add): decoding chunk by chunk
    # rounds exactly as decoding them merged (kvbench.methods.core.contracts.Codec.chunk_separable)
    chunk_separable = True

    def reference_encode(self, x: torch.Tensor) -> Packed:
        if self.format.axis == "channel":
            return self._encode_channels(x)
        lead, length = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, length)
        n, groups = flat.shape[0], -(-length // self.format.group_size)
        codes = torch.empty(n, packed_length(length, self.format.bits), dtype=torch.uint8,
                            device=x.device)
        scale = torch.empty(n, groups, dtype=torch.float16, device=x.device)
        zero = torch.empty_like(scale)
        for start in range(0, n, ROWS_PER_BLOCK):
            block = slice(start, start + ROWS_PER_BLOCK)
            codes[block], scale[block], zero[block] = self._encode_rows(flat[block])
        return Packed(
            {"codes": codes.view(*lead, -1), "scale": scale.view(*lead, groups),
             "min": zero.view(*lead, groups)},
            tuple(x.shape),
            x.dtype,
        )

    def _token_step(self, dim: int) -> int:
        """Tokens per block on the channel axis: whole groups and whole bytes, ~ROWS_PER_BLOCK
        tokens' worth of values."""
        unit = self.format.group_size * 8
        return max(unit, ROWS_PER_BLOCK * 128 // dim // unit * unit)

    def _encode_channels(self, x: torch.Tensor) -> Packed:
        """Rows are channels over tokens: each (tokens block, channels) tile is transposed in
        cache, never the whole tensor at once."""
        lead, tokens, dim = x.shape[:-2], x.shape[-2], x.shape[-1]
        flat = x.reshape(-1, tokens, dim)
        groups, step = -(-tokens // self.format.group_size), self._token_step(dim)
        codes = torch.empty(flat.shape[0], dim, packed_length(tokens, self.format.bits),
                            dtype=torch.uint8, device=x.device)
        scale = torch.empty(flat.shape[0], dim, groups, dtype=torch.float16, device=x.device)
        zero = torch.empty_like(scale)
        for i in range(flat.shape[0]):
            for start in range(0, tokens, step):
                c, sc, z = self._encode_rows(flat[i, start : start + step].T.contiguous())
                first_byte = start * self.format.bits // 8
                first_group = start // self.format.group_size
                codes[i, :, first_byte : first_byte + c.shape[-1]] = c
                scale[i, :, first_group : first_group + sc.shape[-1]] = sc
                zero[i, :, first_group : first_group + z.shape[-1]] = z
        return Packed(
            {"codes": codes.view(*lead, dim, -1), "scale": scale.view(*lead, dim, groups),
             "min": zero.view(*lead, dim, groups)},
            tuple(x.shape),
            x.dtype,
        )

    def _encode_rows(self, rows: torch.Tensor):
        length = rows.shape[-1]
        groups = -(-length // self.format.group_size)
        extra = groups * self.format.group_size - length
        if extra:
            # Repeating a row's last value leaves its partial group's min and max as they are.
            work = F.pad(rows.float().unsqueeze(1), (0, extra), mode="replicate").squeeze(1)
        else:
            work = rows.to(torch.float32, copy=True)  # quantized in place below
        grouped = work.view(-1, groups, self.format.group_size)
        lo, hi = grouped.amin(-1), grouped.amax(-1)
        levels = (1 << self.format.bits) - 1
        scale, zero = divide(hi - lo, levels).half(), lo.half()
        # Quantize with the stored fp16 values so decode reproduces exactly what encode chose.
        divisor = torch.where(scale == 0, 1.0, scale.float())
        grouped.sub_(zero.float()[..., None]).div_(divisor[..., None]).round_().clamp_(0, levels)
        return pack_bits(work[:, :length].to(torch.uint8), self.format.bits), scale, zero

    def reference_decode(self, packed: Packed) -> torch.Tensor:
        if self.format.axis == "channel":
            return self._decode_channels(packed)
        length = packed.shape[-1]
        codes, scale, zero = (packed.tensors[k] for k in ("codes", "scale", "min"))
        lead = codes.shape[:-1]
        codes, scale, zero = (t.reshape(-1, t.shape[-1]) for t in (codes, scale, zero))
        out = torch.empty(codes.shape[0], length, dtype=packed.dtype, device=codes.device)
        for start in range(0, codes.shape[0], ROWS_PER_BLOCK):
            block = slice(start, start + ROWS_PER_BLOCK)
            out[block] = self._decode_rows(codes[block], scale[block], zero[block], length)
        return out.view(*lead, length)

    def _decode_channels(self, packed: Packed) -> torch.Tensor:
        tokens, dim = packed.shape[-2], packed.shape[-1]
        codes, scale, zero = (packed.tensors[k] for k in ("codes", "scale", "min"))
        codes, scale, zero = (t.reshape(-1, dim, t.shape[-1]) for t in (codes, scale, zero))
        out = torch.empty(codes.shape[0], tokens, dim, dtype=packed.dtype, device=codes.device)
        step = self._token_step(dim)
        for i in range(codes.shape[0]):
            for start in range(0, tokens, step):
                n = min(step, tokens - start)
                first_byte = start * self.format.bits // 8
                first_group = start // self.format.group_size
                bytes_ = packed_length(n, self.format.bits)
                groups = -(-n // self.format.group_size)
                out[i, start : start + n] = self._decode_rows(
                    codes[i, :, first_byte : first_byte + bytes_],
                    scale[i, :, first_group : first_group + groups],
                    zero[i, :, first_group : first_group + groups], n,
                ).T
        return out.view(packed.shape)

    def _decode_rows(self, codes, scale, zero, length: int) -> torch.Tensor:
        groups = scale.shape[-1]
        values = unpack_bits(codes, self.format.bits, length).float()
        extra = groups * self.format.group_size - length
        if extra:
            values = F.pad(values, (0, extra))
        grouped = values.view(-1, groups, self.format.group_size)
        grouped.mul_(scale.float()[..., None]).add_(zero.float()[..., None])
        return values[:, :length]

    def kernel_unsupported(self) -> str | None:
        return self.format.unsupported()

    def kernel_format(self, dim: int) -> IntQFormat:
        return self.format


@implements(IntQ)
class TorchIntQ(CodecMethod):
    settings: IntQ

    def codec(self) -> IntQCodec:
        return self.run_as(IntQCodec(self.settings.format()))
