"""Methods on MLX: the same Codec and LayerCachePolicy contracts (kvbench.methods.base) on mx.array.

Each MLX implementation is a class registered for a torch Method class with @mlx_implementation;
it is built from that method's config (the dataclass a suite made) and offers what a benchmark
needs: codec(), key_codec(), value_codec(), new_layer_cache(layer_idx), calibrate(). The torch
method is the reference; tests/test_mlx_parity.py checks each implementation against it.
"""
from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx

from kvbench.methods.base import Codec, LayerCachePolicy, Method, Packed

_IMPLEMENTATIONS: dict[type, type] = {}


def mlx_implementation(method_cls: type[Method]) -> Callable[[type], type]:
    """Register the decorated class as the MLX implementation of `method_cls` (and of its
    subclasses, e.g. the turbo presets, unless they register their own)."""
    def register(cls: type) -> type:
        _IMPLEMENTATIONS[method_cls] = cls
        return cls
    return register


def has_mlx(method_cls: type[Method]) -> bool:
    return any(c in _IMPLEMENTATIONS for c in method_cls.__mro__)


def on_mlx(method: Method) -> "MLXMethod":
    """`method` as MLX runs it."""
    for cls in type(method).__mro__:
        if cls in _IMPLEMENTATIONS:
            return _IMPLEMENTATIONS[cls](method)
    raise NotImplementedError(f"method {type(method).name or type(method).__name__!r} has no MLX"
                              " implementation")


class MLXMethod:
    """Base of MLX implementations: `config` is the torch Method whose fields configure it."""

    def __init__(self, config: Method):
        self.config = config

    def codec(self) -> Codec | None:
        return None

    def key_codec(self) -> Codec | None:
        return self.codec()

    def value_codec(self) -> Codec | None:
        return self.codec()

    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        raise NotImplementedError

    def calibrate(self, model: Any, tokens: list[int]) -> None:
        """As Method.calibrate, with an MLX-hosted model."""

    def layout(self) -> str:
        return self.config.layout()


def array_bytes(*arrays: mx.array | None) -> int:
    return sum(a.nbytes for a in arrays if a is not None)


class MLXCodec(Codec):
    """A Codec whose Packed holds mx.array tensors (and an mx dtype)."""

    def nbytes(self, packed: Packed) -> int:
        return array_bytes(*packed.tensors.values())


class MLXCodecCache(LayerCachePolicy):
    """kvbench.methods.codec_cache.CodecCache on mx.array: keys and values packed by their
    codecs, the newest `window` tokens (and any that do not fill a codec token_block) raw."""

    def __init__(self, key_codec: Codec, value_codec: Codec, window: int = 0):
        self.key_codec, self.value_codec, self.window = key_codec, value_codec, window
        self._block = max(key_codec.token_block, value_codec.token_block)
        self._packed: list[tuple[Packed, Packed]] = []
        self._packed_tokens = 0
        self._raw_k: mx.array | None = None
        self._raw_v: mx.array | None = None

    def append(self, keys, values, queries=None) -> None:
        if self._raw_k is None:
            self._raw_k, self._raw_v = keys, values
        else:
            self._raw_k = mx.concatenate([self._raw_k, keys], axis=-2)
            self._raw_v = mx.concatenate([self._raw_v, values], axis=-2)
        spill = self._raw_k.shape[-2] - self.window
        spill -= spill % self._block
        if spill > 0:
            # contiguous() copies the kept tail (torch: clone()): an MLX slice would keep the
            # whole buffer it was cut from alive
            k_old, v_old = self._raw_k[..., :spill, :], self._raw_v[..., :spill, :]
            self._raw_k = mx.contiguous(self._raw_k[..., spill:, :])
            self._raw_v = mx.contiguous(self._raw_v[..., spill:, :])
            self._packed.append((self.key_codec.encode(k_old), self.value_codec.encode(v_old)))
            self._packed_tokens += spill
            if len(self._packed) > 1:
                keys_m = self.key_codec.merge([pk for pk, _ in self._packed])
                values_m = self.value_codec.merge([pv for _, pv in self._packed])
                if keys_m is not None and values_m is not None:
                    self._packed = [(keys_m, values_m)]

    def trim(self, n: int) -> int:
        """Only full-precision tokens can be taken back; packed ones stay."""
        keep = max(0, self._raw_k.shape[-2] - n) if self._raw_k is not None else 0
        dropped = 0 if self._raw_k is None else self._raw_k.shape[-2] - keep
        if dropped:
            self._raw_k, self._raw_v = self._raw_k[..., :keep, :], self._raw_v[..., :keep, :]
        return dropped

    def attention_inputs(self):
        dtype = self._raw_k.dtype
        keys = [self.key_codec.decode(pk).astype(dtype) for pk, _ in self._packed]
        values = [self.value_codec.decode(pv).astype(dtype) for _, pv in self._packed]
        return (mx.concatenate(keys + [self._raw_k], axis=-2),
                mx.concatenate(values + [self._raw_v], axis=-2), None)

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        raw = 0 if self._raw_k is None else self._raw_k.shape[-2]
        return self._packed_tokens + raw

    @property
    def retained_bytes(self) -> int:
        packed = sum(self.key_codec.nbytes(pk) + self.value_codec.nbytes(pv)
                     for pk, pv in self._packed)
        return packed + array_bytes(self._raw_k, self._raw_v)

    def measured_bytes(self) -> int:
        held = [t for pk, pv in self._packed for t in (*pk.tensors.values(), *pv.tensors.values())]
        return array_bytes(*held, self._raw_k, self._raw_v)
