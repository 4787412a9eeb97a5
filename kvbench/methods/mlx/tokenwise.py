"""MLX codecs whose stored tensors all keep tokens on one axis: parts merge by concatenation."""
from __future__ import annotations

import mlx.core as mx

from kvbench.methods.core.contracts import Codec, Packed


class MLXTokenwiseCodec(Codec):
    """Every stored tensor has tokens at axis ndim(x) - 2, counted from the front. Unlike the
    torch TokenwiseCodec, encode and decode take the whole tensor at once: torch's blocks of
    8192 tokens keep its in-place temporaries in cache, and MLX builds a lazy graph instead."""

    def merge(self, parts: list[Packed]) -> Packed:
        axis = len(parts[0].shape) - 2
        tensors = {name: mx.concatenate([p.tensors[name] for p in parts], axis=axis)
                   for name in parts[0].tensors}
        tokens = sum(p.shape[-2] for p in parts)
        return Packed(tensors, (*parts[0].shape[:-2], tokens, parts[0].shape[-1]), parts[0].dtype)
