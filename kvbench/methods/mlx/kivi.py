"""`kivi` on MLX: 2/4-bit keys per channel, values per token, the newest tokens in full precision
(kvbench.methods.kivi), codecs and the KiviCache policy."""
from __future__ import annotations

import mlx.core as mx

from kvbench.methods.base import LayerCachePolicy, Packed
from kvbench.methods.kivi import Kivi
from kvbench.methods.mlx.base import MLXMethod, array_bytes, mlx_implementation
from kvbench.methods.mlx.intq import MLXIntQCodec


class _Stream:
    """Keys or values of one layer: the oldest tokens packed by `codec` (merged into one block
    whenever the layout allows), the newer ones raw, in token order."""

    def __init__(self, codec: MLXIntQCodec):
        self.codec = codec
        self.packed: list[Packed] = []
        self.packed_tokens = 0
        self.raw: mx.array | None = None

    @property
    def raw_tokens(self) -> int:
        return 0 if self.raw is None else self.raw.shape[-2]

    def push(self, x: mx.array) -> None:
        self.raw = x if self.raw is None else mx.concatenate([self.raw, x], axis=-2)

    def pack_oldest(self, tokens: int) -> None:
        if tokens <= 0:
            return
        # contiguous() copies the kept tail (torch: clone()), so that the view does not keep the
        # buffer of the tokens just packed alive.
        old, self.raw = self.raw[..., :tokens, :], mx.contiguous(self.raw[..., tokens:, :])
        self.packed.append(self.codec.encode(old))
        self.packed_tokens += tokens
        merged = self.codec.merge(self.packed) if len(self.packed) > 1 else None
        if merged is not None:
            self.packed = [merged]

    def read(self) -> mx.array:
        decoded = [self.codec.decode(p).astype(self.raw.dtype) for p in self.packed]
        return mx.concatenate(decoded + [self.raw], axis=-2)

    def nbytes(self) -> int:
        return sum(self.codec.nbytes(p) for p in self.packed) + array_bytes(self.raw)

    def held(self) -> list[mx.array]:
        return [t for p in self.packed for t in p.tensors.values()] + [self.raw]


class MLXKiviCache(LayerCachePolicy):
    """KiviCache on mx.array: each append first quantizes what earlier steps left (whole key
    chunks of `residual` tokens; values older than the newest `residual`), then adds the new
    tokens raw, so attention reads the current step's keys and values in full precision."""

    def __init__(self, method: "MLXKivi"):
        self.keys = _Stream(method.key_codec())
        self.values = _Stream(method.value_codec())
        self.key_chunk = method.config.residual or method.config.group_size
        self.residual = method.config.residual

    def append(self, keys, values, queries=None) -> None:
        self._quantize()
        self.keys.push(keys)
        self.values.push(values)

    def end_prefill(self) -> None:
        self._quantize()

    def _quantize(self) -> None:
        raw_keys = self.keys.raw_tokens
        self.keys.pack_oldest(raw_keys - raw_keys % self.key_chunk)
        self.values.pack_oldest(self.values.raw_tokens - self.residual)

    def attention_inputs(self):
        return self.keys.read(), self.values.read(), None

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        return self.keys.packed_tokens + self.keys.raw_tokens

    @property
    def retained_bytes(self) -> int:
        return self.keys.nbytes() + self.values.nbytes()

    def measured_bytes(self) -> int:
        # The raw tail is a copy (see pack_oldest); arrays count at their own size (nbytes).
        return array_bytes(*self.keys.held(), *self.values.held())


@mlx_implementation(Kivi)
class MLXKivi(MLXMethod):
    """Kivi on MLX; config: kvbench.methods.kivi.Kivi (bits, group_size, residual). codec() is
    None: keys (per channel) and values (per token) use different codecs."""

    def key_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.config.bits, self.config.group_size, "channel")

    def value_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.config.bits, self.config.group_size, "token")

    def new_layer_cache(self, layer_idx: int) -> MLXKiviCache:
        return MLXKiviCache(self)
