"""A packed cache's read in parts (LayerCachePolicy.attention_parts): the packed tokens decoded a
part at a time, when attention reaches them, so that a read never holds the layer decoded whole."""
from __future__ import annotations

import math
from typing import Any

from kvbench.methods.core.contracts import Codec, Packed, ReadPart

# A small read: a layer's keys and values within this at the raw dtype (an 8B's at 1k tokens in
# float32, 2k in bf16). On a CPU a larger one comes in parts of about this size
# (kvbench.models.part_attention.part_bytes); a smaller one is read whole, as before parts
# existed, so short contexts keep their bits.
READ_PART_BYTES = 8 * 2**20


def as_part(keys, values) -> ReadPart:
    """A part already held as arrays."""
    return ReadPart(keys.shape[-2], lambda: (keys, values))


def decoded_parts(key_codec: Codec, value_codec: Codec, pk: Packed, pv: Packed, dtype: Any,
                  ops: Any, tokens_per_part: int) -> list[ReadPart]:
    """One packed block as parts of at most `tokens_per_part` tokens (a multiple of the codecs'
    token blocks), each decoded and cast to `dtype` when read; the block whole where a codec
    does not stack its tokens along one axis (Codec.stacking_axis)."""
    axes = key_codec.stacking_axis(pk), value_codec.stacking_axis(pv)
    tokens = pk.shape[-2]
    if None in axes or tokens <= tokens_per_part:
        return [_decoded(key_codec, value_codec, pk, pv, dtype, ops)]
    return [_decoded(key_codec, value_codec, _tokens(pk, axes[0], start, tokens_per_part),
                     _tokens(pv, axes[1], start, tokens_per_part), dtype, ops)
            for start in range(0, tokens, tokens_per_part)]


def _decoded(key_codec: Codec, value_codec: Codec, pk: Packed, pv: Packed, dtype: Any,
             ops: Any) -> ReadPart:
    return ReadPart(pk.shape[-2], lambda: (ops.cast(key_codec.decode(pk), dtype),
                                           ops.cast(value_codec.decode(pv), dtype)))


def _tokens(packed: Packed, axis: int, start: int, count: int) -> Packed:
    """Tokens start .. start + count of `packed` (fewer at its end), as views of its arrays."""
    stop = min(start + count, packed.shape[-2])
    index = (slice(None),) * axis + (slice(start, stop),)
    tensors = {name: t[index] for name, t in packed.tensors.items()}
    return Packed(tensors, (*packed.shape[:-2], stop - start, packed.shape[-1]), packed.dtype,
                  packed.meta)


def token_bytes(ops: Any, keys: Any) -> int:
    """Bytes of one token's keys and values in a layer whose keys are like `keys` (None: 0)."""
    if keys is None:
        return 0
    return 2 * ops.itemsize(keys) * math.prod(keys.shape[:-2]) * keys.shape[-1]


def tokens_per_part(part_bytes: int, token_bytes: int, token_block: int) -> int:
    """Tokens of a part of about `part_bytes`, whole token blocks of the codecs."""
    tokens = max(token_block, part_bytes // max(token_bytes, 1))
    return tokens - tokens % token_block
