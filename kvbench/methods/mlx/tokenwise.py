"""MLX codecs whose stored tensors all keep tokens on one axis: parts merge by concatenation."""
from __future__ import annotations

import mlx.core as mx

from kvbench.methods.core.contracts import Codec, Packed, concat_packed


class MLXTokenwiseCodec(Codec):
    """Every stored tensor has tokens at axis ndim(x) - 2, counted from the front. Unlike the
    torch TokenwiseCodec, encode and decode take the whole tensor at once: torch's blocks of
    8192 tokens keep its in-place temporaries in cache, and MLX builds a lazy graph instead."""

    def merge(self, parts: list[Packed]) -> Packed:
        return concat_packed(parts, len(parts[0].shape) - 2, mx.concatenate)

    def stacking_axis(self, packed: Packed) -> int:
        return len(packed.shape) - 2
