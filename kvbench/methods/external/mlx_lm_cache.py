"""mlx-lm's own KV caches on MLX (settings: kvbench.methods.settings.mlx_lm_cache). Each layer's
policy holds one cache object of mlx-lm's class and hands on exactly what its update_and_fetch
returns. A model layer reads it through kvbench.models.mlx_host.MLXLibraryLayer, which also gives
mlx-lm's attention the cache's own mask and, for the quantized cache, its bits and group size:
the model computes what it computes under mlx-lm's generate_step with these caches.

mlx-lm is imported when a cache is built, so that registering the MLX methods needs MLX only."""
from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.mlx_lm_cache import MLXLMQuantized, MLXLMRotating


class MLXLMLayer(LayerCachePolicy):
    """One model layer's mlx-lm cache object, `cache`.

    Tokens seen are its offset: the RoPE position mlx-lm gives the next token. Tokens retained
    are those attention reads (its keys_and_values()). Accounted bytes are those tokens' entries
    in every array it holds; measured bytes are the arrays whole, with the room mlx-lm allocates
    ahead (zeros, in steps of cache.step = 256 tokens, the rotating cache up to max_size)."""

    def __init__(self, cache: Any):
        self.cache = cache

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        """The cache's own: what mlx-lm's attention reads for the step."""
        return self.cache.update_and_fetch(keys, values)

    def append(self, keys, values, queries=None) -> None:
        self.update_and_fetch(keys, values)

    def attention_inputs(self) -> tuple[mx.array, mx.array, None]:
        """The read of a host that attends over plain arrays (kvbench.testing's, a wrapper's
        MLXPolicyLayer): the keys and values the cache holds, in its order."""
        keys, values = self.cache.keys_and_values()
        return keys, values, None

    def trim(self, n: int) -> int:
        return self.cache.trim(n) if self.cache.is_trimmable() else 0

    def held(self) -> list[mx.array]:
        """Every array the cache holds (the quantized cache's codes, scales and biases)."""
        if self.cache.empty():
            return []
        return [array for _, array in tree_flatten([self.cache.keys, self.cache.values])]

    @property
    def seen_tokens(self) -> int:
        return self.cache.offset

    @property
    def retained_tokens(self) -> int:
        held = self.held()
        return min(self.cache.offset, held[0].shape[-2]) if held else 0

    @property
    def retained_bytes(self) -> int:
        # every array holds one row per token of room along axis -2
        return sum(a.nbytes // a.shape[-2] for a in self.held()) * self.retained_tokens

    def measured_bytes(self) -> int:
        return sum(a.nbytes for a in self.held())


class MLXLMQuantizedLayer(MLXLMLayer):
    """A QuantizedKVCache: a plain-array host reads its codes dequantized (mx.dequantize, the
    values mx.quantized_matmul multiplies by)."""

    def attention_inputs(self) -> tuple[mx.array, mx.array, None]:
        cache = self.cache
        keys, values = (mx.dequantize(*codes, group_size=cache.group_size, bits=cache.bits)
                        for codes in cache.keys_and_values())
        return keys, values, None


@implements(MLXLMQuantized, backend="mlx")
class MLXLMQuantizedMethod(Implementation):
    stores_reads = False  # it stores codes; a plain-array read is them dequantized

    def new_layer_cache(self, layer_idx: int) -> MLXLMQuantizedLayer:
        from mlx_lm.models.cache import QuantizedKVCache

        return MLXLMQuantizedLayer(QuantizedKVCache(group_size=self.settings.group_size,
                                                    bits=self.settings.bits))


@implements(MLXLMRotating, backend="mlx")
class MLXLMRotatingMethod(Implementation):
    def new_layer_cache(self, layer_idx: int) -> MLXLMLayer:
        from mlx_lm.models.cache import RotatingKVCache

        return MLXLMLayer(RotatingKVCache(max_size=self.settings.max_size,
                                          keep=self.settings.keep))
