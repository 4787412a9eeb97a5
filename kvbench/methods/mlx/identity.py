"""`identity` on MLX: keeps every key and value (kvbench.methods.settings.identity)."""
from __future__ import annotations

import mlx.core as mx

from kvbench.methods.core.codec_cache import UNBOUNDED_WINDOW, CodecMethod
from kvbench.methods.core.contracts import Codec, Packed
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.identity import Identity

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


class MLXCastCodec(Codec):
    """Stores the tensor as `dtype` ("auto": unchanged, so decode is exact). Stored tensor:
    values, x's shape, in `dtype`."""

    # decode is a cast, value by value (kvbench.methods.core.contracts.Codec.chunk_separable)
    chunk_separable = True

    def __init__(self, dtype: str = "auto"):
        self.dtype = dtype

    def encode(self, x: mx.array) -> Packed:
        stored = x if self.dtype == "auto" else x.astype(DTYPES[self.dtype])
        return Packed({"values": stored}, tuple(x.shape), x.dtype)

    def decode(self, packed: Packed) -> mx.array:
        return packed.tensors["values"].astype(packed.dtype)

    def merge(self, parts: list[Packed]) -> Packed:
        values = mx.concatenate([p.tensors["values"] for p in parts], axis=-2)
        return Packed({"values": values}, tuple(values.shape), parts[0].dtype)

    def layout(self) -> str:
        return f"identity ({self.dtype})"


@implements(Identity, backend="mlx")
class MLXIdentity(CodecMethod):
    settings: Identity

    def codec(self) -> MLXCastCodec:
        return MLXCastCodec(self.settings.dtype)

    @property
    def window(self) -> int:
        # Everything stays "raw" (the window covers all tokens) when no cast is asked for.
        return UNBOUNDED_WINDOW if self.settings.dtype == "auto" else 0
