"""`identity`: keeps every key and value; the reference every other method is measured against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from kvbench.backends.torch_backend import DTYPES
from kvbench.methods.base import Capabilities, Codec, Method, Packed, register_method
from kvbench.methods.codec_cache import UNBOUNDED_WINDOW, CodecCache



class CastCodec(Codec):
    """Stores the tensor as `dtype` ("auto": unchanged, so decode is exact)."""

    # decode is a cast, value by value (kvbench.methods.base.Codec.chunk_separable)
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


@register_method("identity")
@dataclass
class Identity(Method):
    """Keeps everything.

    Must reproduce the unmodified model exactly with dtype "auto" (stores what the model gives).

    Parameters:
        dtype: "auto" | "float16" | "bfloat16" | "float32" — storage dtype (default "auto").
    """

    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"

    def __post_init__(self):
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({}, {"dtype": "float16"})

    def supports(self) -> Capabilities:
        # stored as given, every token stays raw and can be taken back; a cast packs them
        return Capabilities(trim=self.dtype == "auto")

    def codec(self) -> Codec:
        return CastCodec(self.dtype)

    def new_layer_cache(self, layer_idx: int) -> CodecCache:
        # Everything stays "raw" (window covers all tokens) when no cast is asked for.
        window = UNBOUNDED_WINDOW if self.dtype == "auto" else 0
        return CodecCache(self.codec(), self.codec(), window=window)
