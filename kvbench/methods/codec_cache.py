"""A codec as a layer cache policy: packed storage, decoded on read (the reference path)."""
from __future__ import annotations

from kvbench.methods.array_ops import TORCH_OPS
from kvbench.methods.base import Codec, LayerCachePolicy, Packed


class CodecCache(LayerCachePolicy):
    """Stores keys and values packed by `codec`; the newest `window` tokens (and any tokens that
    do not yet fill a whole `codec.token_block`) stay in full precision and count at their dtype.
    Array operations go through `ops` (kvbench.methods.array_ops)."""

    ops = TORCH_OPS

    def __init__(self, key_codec: Codec, value_codec: Codec, window: int = 0):
        self.key_codec = key_codec
        self.value_codec = value_codec
        self.window = window
        self._block = max(key_codec.token_block, value_codec.token_block)
        self._packed: list[tuple[Packed, Packed]] = []
        self._packed_tokens = 0
        self._raw_k = None
        self._raw_v = None

    def append(self, keys, values, queries=None) -> None:
        if self._raw_k is None:
            self._raw_k, self._raw_v = keys, values
        else:
            self._raw_k = self.ops.concat([self._raw_k, keys])
            self._raw_v = self.ops.concat([self._raw_v, values])
        spill = self._raw_k.shape[-2] - self.window
        spill -= spill % self._block
        if spill > 0:
            # copies, so the kept tail does not pin the storage of what was packed
            k_old, v_old = self._raw_k[..., :spill, :], self._raw_v[..., :spill, :]
            self._raw_k = self.ops.copy(self._raw_k[..., spill:, :])
            self._raw_v = self.ops.copy(self._raw_v[..., spill:, :])
            self._packed.append((self.key_codec.encode(k_old), self.value_codec.encode(v_old)))
            self._packed_tokens += spill
            self._merge_packed()

    def _merge_packed(self) -> None:
        if len(self._packed) < 2:
            return
        keys = self.key_codec.merge([pk for pk, _ in self._packed])
        values = self.value_codec.merge([pv for _, pv in self._packed])
        if keys is not None and values is not None:
            self._packed = [(keys, values)]

    def trim(self, n: int) -> int:
        """Only full-precision tokens can be taken back; packed ones stay."""
        keep = max(0, self._raw_k.shape[-2] - n) if self._raw_k is not None else 0
        dropped = 0 if self._raw_k is None else self._raw_k.shape[-2] - keep
        if dropped:
            self._raw_k, self._raw_v = self._raw_k[..., :keep, :], self._raw_v[..., :keep, :]
        return dropped

    def attention_inputs(self):
        keys = [self.key_codec.decode(pk) for pk, _ in self._packed]
        values = [self.value_codec.decode(pv) for _, pv in self._packed]
        dtype, cast = self._raw_k.dtype, self.ops.cast
        keys = self.ops.concat([cast(k, dtype) for k in keys] + [self._raw_k])
        values = self.ops.concat([cast(v, dtype) for v in values] + [self._raw_v])
        return keys, values, None

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        raw = 0 if self._raw_k is None else self._raw_k.shape[-2]
        return self._packed_tokens + raw

    @property
    def retained_bytes(self) -> int:
        packed = sum(
            self.key_codec.nbytes(pk) + self.value_codec.nbytes(pv) for pk, pv in self._packed
        )
        return packed + self.ops.nbytes(self._raw_k, self._raw_v)

    def measured_bytes(self) -> int:
        held = [t for pk, pv in self._packed for t in (*pk.tensors.values(), *pv.tensors.values())]
        return self.ops.held_bytes(*held, self._raw_k, self._raw_v)
