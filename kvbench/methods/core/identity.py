"""`identity`'s codec and method on any backend (kvbench.methods.settings.identity): a cast, or
none, of the backend's arrays, which each backend's codec names (kvbench.backends.arrays)."""
from __future__ import annotations

from typing import Any

from kvbench.methods.core.codec_cache import UNBOUNDED_WINDOW, CodecMethod
from kvbench.methods.core.contracts import Codec, Packed, concat_packed
from kvbench.methods.settings.identity import Identity


class IdentityCodec(Codec):
    """Stores the tensor as `dtype` ("auto": unchanged, so decode is exact). Stored tensor:
    values, x's shape, in `dtype`. A backend's codec names its `arrays` and `dtypes` (its
    library's dtype of each name)."""

    dtypes: dict[str, Any]

    # decode is a cast, value by value (kvbench.methods.core.contracts.Codec.chunk_separable)
    chunk_separable = True

    def __init__(self, dtype: str = "auto"):
        super().__init__()
        self.dtype = dtype

    def encode(self, x) -> Packed:
        stored = x if self.dtype == "auto" else self.arrays.cast(x, self.dtypes[self.dtype])
        return Packed({"values": self.kept(stored)}, tuple(x.shape), x.dtype)

    def kept(self, stored):
        """`stored` as the codec keeps it (as it is, unless its backend's codec says)."""
        return stored

    def decode(self, packed: Packed):
        return self.arrays.cast(packed.tensors["values"], packed.dtype)

    def merge(self, parts: list[Packed]) -> Packed:
        return concat_packed(parts, -2, self.arrays.concat)

    def layout(self) -> str:
        return f"identity ({self.dtype})"


class IdentityMethod(CodecMethod):
    """identity on a backend, which builds its IdentityCodec (codec())."""

    settings: Identity

    @property
    def window(self) -> int:
        # Everything stays "raw" (the window covers all tokens) when no cast is asked for.
        return UNBOUNDED_WINDOW if self.settings.dtype == "auto" else 0
