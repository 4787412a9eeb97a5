"""kvbench.models.session's Session on MLX: the model on mlx-lm, the method's cache an
MLXKVBenchCache, the reference mlx-lm's own KVCache. Every clock read follows an mx.eval of the
logits and of every array the cache holds (MLX is lazy: unevaluated work is not done work).
Logits go to torch as float32 on the CPU; benchmarks do their arithmetic in float64 there (MLX's
float32 reductions over a vocabulary row are ~1e-5 relative off on the CPU).
"""
from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten
import numpy as np
import torch

from kvbench.backends.mlx_backend import peak_memory_bytes, reset_peak_memory, timed
from kvbench.methods.base import Method
from kvbench.methods.mlx.base import on_mlx
from kvbench.models.mlx_host import MLXKVBenchCache, MLXLoaded, cache_arrays, mlx_logits


class MLXSession:
    def __init__(self, loaded: MLXLoaded):
        self.loaded = loaded
        self.spec, self.tokenizer = loaded.spec, loaded.tokenizer
        self.num_layers, self.num_kv_heads = loaded.num_layers, loaded.num_kv_heads
        self.head_dim = loaded.head_dim
        # K/V come out of the projections at the weights' float dtype
        weight = next(w for _, w in tree_flatten(loaded.model.parameters())
                      if mx.issubdtype(w.dtype, mx.floating))
        self.kv_element_size = weight.dtype.size
        self.dtype = str(weight.dtype).rpartition(".")[2]  # mlx.core.float32 -> float32

    def new_cache(self, method: Method | None):
        from mlx_lm.models.cache import make_prompt_cache

        if method is None:
            return make_prompt_cache(self.loaded.model)
        return MLXKVBenchCache(method, self.num_layers)

    def step(self, ids: list[int], cache, last_only: bool = False) -> tuple[torch.Tensor, float]:
        x = mx.array([ids])
        (logits, _), seconds = timed(
            lambda: (mlx_logits(self.loaded.model, x, cache, last_only), cache_arrays(cache)))
        return _to_torch(logits[0]), seconds

    def full_logits(self, ids: list[int], last: int) -> torch.Tensor:
        logits = self.loaded.model(mx.array([ids]))[0, -last:, :]
        return _to_torch(logits)

    def end_prefill(self, cache) -> float:
        if not isinstance(cache, MLXKVBenchCache):
            return 0.0
        def finish():
            cache.end_prefill()
            return cache_arrays(cache)

        return timed(finish)[1]

    def trim(self, cache, n: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        layers = cache.layers if isinstance(cache, MLXKVBenchCache) else cache
        trimmed = trim_prompt_cache(layers, n)
        if trimmed != n:
            raise ValueError(f"the cache took back {trimmed} of the {n} newest tokens")

    def calibrate(self, method: Method, tokens: list[int]) -> None:
        on_mlx(method).calibrate(self.loaded, tokens)

    def reset_peak_memory(self) -> None:
        reset_peak_memory()

    def peak_memory(self) -> tuple[int, str]:
        return peak_memory_bytes(), "mx.get_peak_memory (MLX allocator)"


def _to_torch(logits: mx.array) -> torch.Tensor:
    return torch.from_numpy(np.array(logits.astype(mx.float32)))
