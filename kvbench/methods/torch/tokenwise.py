"""Codecs whose stored tensors all keep tokens on one axis: blocks of tokens encode, decode and
merge independently, so big tensors go through in cache-sized blocks."""
from __future__ import annotations

from abc import abstractmethod

import torch

from kvbench.methods.core.contracts import Packed, concat_packed
from kvbench.methods.torch.base import KernelCodec

# A block's float32 temporaries stay in cache and are reused; whole-tensor temporaries would each
# be written to fresh memory, which is most of the time on large inputs.
TOKENS_PER_BLOCK = 8192


class TokenwiseCodec(KernelCodec):
    """Every stored tensor has tokens at axis ndim(x) - 2, counted from the front (a layout may add
    axes after it, e.g. blocks per token then bytes). The torch reference goes through in blocks
    of TOKENS_PER_BLOCK tokens; a kernel, where impl picks one, takes the whole tensor at once."""

    @abstractmethod
    def encode_block(self, x: torch.Tensor) -> Packed: ...

    @abstractmethod
    def decode_block(self, packed: Packed) -> torch.Tensor: ...

    def reference_encode(self, x: torch.Tensor) -> Packed:
        tokens = x.shape[-2]
        if tokens <= TOKENS_PER_BLOCK:
            return self.encode_block(x)
        starts = range(0, tokens, TOKENS_PER_BLOCK)
        return self.merge([self.encode_block(x[..., s : s + TOKENS_PER_BLOCK, :]) for s in starts])

    def reference_decode(self, packed: Packed) -> torch.Tensor:
        tokens = packed.shape[-2]
        if tokens <= TOKENS_PER_BLOCK:
            return self.decode_block(packed)
        out = torch.empty(packed.shape, dtype=packed.dtype,
                          device=next(iter(packed.tensors.values())).device)
        for start in range(0, tokens, TOKENS_PER_BLOCK):
            part = _token_slice(packed, start, start + TOKENS_PER_BLOCK)
            out[..., start : start + part.shape[-2], :] = self.decode_block(part)
        return out

    def merge(self, parts: list[Packed]) -> Packed:
        return concat_packed(parts, self.stacking_axis(parts[0]), torch.cat)

    def stacking_axis(self, packed: Packed) -> int:
        return len(packed.shape) - 2


def _token_slice(packed: Packed, start: int, stop: int) -> Packed:
    axis = len(packed.shape) - 2
    tensors = {name: t.narrow(axis, start, min(stop, t.shape[axis]) - start)
               for name, t in packed.tensors.items()}
    tokens = min(stop, packed.shape[-2]) - start
    return Packed(tensors, (*packed.shape[:-2], tokens, packed.shape[-1]), packed.dtype, packed.meta)
