"""`identity` on torch: keeps every key and value (kvbench.methods.settings.identity)."""
from __future__ import annotations

import torch

from kvbench.backends.torch_backend import DTYPES
from kvbench.methods.core.codec_cache import UNBOUNDED_WINDOW, CodecMethod
from kvbench.methods.core.contracts import Packed
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.identity import Identity
from kvbench.methods.torch.base import TorchCodec


class CastCodec(TorchCodec):
    """Stores the tensor as `dtype` ("auto": unchanged, so decode is exact)."""

    # decode is a cast, value by value (kvbench.methods.core.contracts.Codec.chunk_separable)
    chunk_separable = True

    def __init__(self, dtype: str = "auto"):
        self.dtype = dtype

    def encode(self, x: torch.Tensor) -> Packed:
        stored = x if self.dtype == "auto" else x.to(DTYPES[self.dtype])
        return Packed({"values": stored.contiguous()}, tuple(x.shape), x.dtype)

    def decode(self, packed: Packed) -> torch.Tensor:
        return packed.tensors["values"].to(packed.dtype)

    def merge(self, parts: list[Packed]) -> Packed:
        values = torch.cat([p.tensors["values"] for p in parts], dim=-2)
        return Packed({"values": values}, tuple(values.shape), parts[0].dtype)

    def layout(self) -> str:
        return f"identity ({self.dtype})"


@implements(Identity)
class TorchIdentity(CodecMethod):
    settings: Identity

    def codec(self) -> CastCodec:
        return CastCodec(self.settings.dtype)

    @property
    def window(self) -> int:
        # Everything stays "raw" (the window covers all tokens) when no cast is asked for.
        return UNBOUNDED_WINDOW if self.settings.dtype == "auto" else 0
