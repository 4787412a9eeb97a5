"""kvbench.models.session's Session on MLX: the model on mlx-lm, the method's cache an
MLXKVBenchCache, the reference mlx-lm's own caches (make_prompt_cache: a KVCache per
full-attention layer, its own cache for every other, as the method's cache has them too). Every
clock read follows an mx.eval of the logits and of every array the cache holds (MLX is lazy:
unevaluated work is not done work).
Logits go to torch as float32 on the CPU; benchmarks do their arithmetic in float64 there (MLX's
float32 reductions over a vocabulary row are ~1e-5 relative off on the CPU).
"""
from __future__ import annotations

import contextlib
import copyreg
import sys
from typing import Any, Callable

import mlx.core as mx
from mlx.utils import tree_flatten
import numpy as np
import torch

from kvbench.backends.mlx_backend import (
    free_memory, peak_memory_bytes, reset_peak_memory, timed,
)
from kvbench.methods.core.contracts import Implementation
from kvbench.models.budgets import activation_bytes_per_token
from kvbench.models.capture import ROWS_PER_CHUNK, entropy_sums
from kvbench.models.mlx_attention import ATTENTION_ATTR, original_attention
from kvbench.models.mlx_host import MLXKVBenchCache, cache_arrays, mlx_logits
from kvbench.models.mlx_loading import MLXLoaded
from kvbench.models.session import SessionBase


def dtype_named(name: str) -> Any:
    return getattr(mx, name)


# MLX's dtypes do not pickle, so a cache holding one could not be forked (deep-copied): each
# copies as the same dtype, found again by name
copyreg.pickle(type(mx.float32), lambda dtype: (dtype_named, (str(dtype).rpartition(".")[2],)))


class MLXSession(SessionBase):
    def __init__(self, loaded: MLXLoaded):
        super().__init__(loaded, MLXKVBenchCache)
        self.value_dim = loaded.value_dim or loaded.head_dim
        # K/V come out of the projections at the weights' float dtype
        weight = next(w for _, w in tree_flatten(loaded.model.parameters())
                      if mx.issubdtype(w.dtype, mx.floating))
        self.kv_element_size = weight.dtype.size
        self.dtype = str(weight.dtype).rpartition(".")[2]  # mlx.core.float32 -> float32
        self.memo_key = ("mlx", self.spec, str(mx.default_device()), self.dtype)

    def new_cache(self, method: Implementation | None, decoded_reads: bool = False):
        from mlx_lm.models.cache import make_prompt_cache

        if method is None:
            return make_prompt_cache(self.loaded.model)
        return MLXKVBenchCache(method, self.num_layers, decoded_reads=decoded_reads,
                               model=self.loaded.model, kinds=self.layer_kinds)

    def step(self, ids: list[int], cache, last_only: bool = False) -> tuple[torch.Tensor, float]:
        x = mx.array([ids])
        logits, seconds = self.timed_through(
            cache, lambda: mlx_logits(self.loaded.model, x, cache, last_only))
        return _to_torch(logits[0]), seconds

    def timed_through(self, cache, work: Callable[[], Any]) -> tuple[Any, float]:
        """Evaluating the result and every array the cache holds (MLX is lazy)."""
        (result, _), seconds = timed(lambda: (work(), cache_arrays(cache)))
        return result, seconds

    def step_rows(self, ids: list[int], caches: list) -> torch.Tensor:
        """Row by row: mlx-lm's caches have no batched step here."""
        return torch.cat([self.step([token], cache, last_only=True)[0]
                          for token, cache in zip(ids, caches, strict=True)])

    def full_logits(self, ids: list[int], last: int) -> torch.Tensor:
        logits = self.loaded.model(mx.array([ids]))[0, -last:, :]
        return _to_torch(logits)

    @contextlib.contextmanager
    def _own_attention(self):
        """mlx-lm's own attention function in the model's modules for the block (kvbench's
        wrapper, kvbench.models.mlx_attention, taken out), put back after."""
        modules = [sys.modules[name] for name in self.loaded.attention]
        installed = [getattr(module, ATTENTION_ATTR) for module in modules]
        try:
            for module in modules:
                setattr(module, ATTENTION_ATTR, original_attention(module))
            yield
        finally:
            for module, attend in zip(modules, installed):
                setattr(module, ATTENTION_ATTR, attend)

    def own_attention_logits(self, ids: list[int], last: int) -> torch.Tensor:
        with self._own_attention():
            return self.full_logits(ids, last)

    def own_decode_logits(self, prompt: list[int], tokens: list[int]) -> torch.Tensor:
        """Through mlx-lm's own attention and its own caches (make_prompt_cache)."""
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.loaded.model)
        with self._own_attention():
            rows = [self.step(prompt, cache, last_only=True)[0]]
            rows += [self.step([token], cache, last_only=True)[0] for token in tokens]
        return torch.cat(rows)

    def trim(self, cache, n: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        layers = cache.layers if isinstance(cache, MLXKVBenchCache) else cache
        fixed = [i for i, layer in enumerate(layers) if not layer.is_trimmable()]
        if fixed:
            raise ValueError(
                f"cannot take back the {n} newest tokens: mlx-lm's"
                f" {type(layers[fixed[0]]).__name__} of layer {fixed[0]} cannot (a recurrent"
                " state, or a sliding window already full)")
        trimmed = trim_prompt_cache(layers, n)
        if trimmed != n:
            raise ValueError(f"the cache took back {trimmed} of the {n} newest tokens")

    def attention_entropy_of(self, tokens: list[int], without: frozenset[int]) -> torch.Tensor:
        return attention_entropy(self.loaded, tokens, without)

    def weights_bytes(self) -> int:
        return sum(w.nbytes for _, w in tree_flatten(self.loaded.model.parameters()))

    def reset_peak_memory(self) -> int:
        return reset_peak_memory()

    def peak_memory(self) -> tuple[int, str]:
        return peak_memory_bytes(), "mx.get_peak_memory (MLX allocator)"

    def free_memory(self) -> int:
        return free_memory()

    def activation_bytes_per_token(self) -> int:
        return activation_bytes_per_token(self.loaded.model.args, self.kv_element_size)


def attention_entropy(loaded: MLXLoaded, tokens: list[int],
                      without_attention: frozenset[int] = frozenset()) -> torch.Tensor:
    """kvbench.models.capture.attention_entropy on the MLX model: float64 (layers, query heads),
    the mean entropy in bits of each query head's rows in one causal pass over `tokens`; NaN
    rows for the layers `without_attention` (linear attention, Mamba), which have no weights.

    For the pass, the attention function of the modules that carry kvbench's attention
    (loaded.attention) is wrapped by one that reduces each layer's weights, softmax(q k^T *
    scale) under the model's mask (causal, a sliding window's) in float32 as mlx-lm's attention
    computes them, to entropies before attention goes on; the attending layers attend in order,
    one call each."""
    if not loaded.attention:
        raise ValueError(f"cannot measure attention entropy on {loaded.spec}: its model file"
                         " does not call attention through kvbench.models.mlx_attention")
    entropies: list[torch.Tensor] = []

    def recording(attend):
        def scaled_dot_product_attention(queries, keys, values, *args, **kwargs):
            scale = kwargs["scale"] if "scale" in kwargs else args[1]
            mask = kwargs["mask"] if "mask" in kwargs else (args[2] if len(args) > 2 else None)
            entropies.append(_mean_row_entropy(queries, keys, scale, mask))
            return attend(queries, keys, values, *args, **kwargs)

        return scaled_dot_product_attention

    modules = [sys.modules[name] for name in loaded.attention]
    installed = [getattr(module, ATTENTION_ATTR) for module in modules]
    try:
        for module, attend in zip(modules, installed):
            setattr(module, ATTENTION_ATTR, recording(attend))
        mx.eval(mlx_logits(loaded.model, mx.array([list(tokens)]), None, last_only=True))
    finally:
        for module, attend in zip(modules, installed):
            setattr(module, ATTENTION_ATTR, attend)
    attending = [i for i in range(loaded.num_layers) if i not in without_attention]
    if len(entropies) != len(attending):
        raise RuntimeError(f"attention ran {len(entropies)} times for {len(attending)} attending"
                           " layers; cannot measure attention entropy on this model")
    by_layer = dict(zip(attending, entropies))
    heads = entropies[0].shape
    return torch.stack([by_layer[i] if i in by_layer
                        else torch.full(heads, float("nan"), dtype=torch.float64)
                        for i in range(loaded.num_layers)])


def _mean_row_entropy(queries: mx.array, keys: mx.array, scale: float,
                      mask: Any = None) -> torch.Tensor:
    """Per query head, the mean entropy of its causal attention rows: queries (1, Hq, T, D) and
    keys (1, Hkv, T, D) of one prompt from position 0, under the model's mask where it gave an
    array (a sliding window's, True = attend; or additive); ROWS_PER_CHUNK rows at a time."""
    heads, rows = queries.shape[1], queries.shape[2]
    k = mx.repeat(keys[0].astype(mx.float32), heads // keys.shape[1], axis=0)
    total = torch.zeros(heads, dtype=torch.float64)
    for start in range(0, rows, ROWS_PER_CHUNK):
        q = queries[0, :, start : start + ROWS_PER_CHUNK].astype(mx.float32)
        logits = q @ k.swapaxes(-1, -2) * scale
        visible = mx.arange(start, start + q.shape[1])[:, None] >= mx.arange(k.shape[1])[None]
        if isinstance(mask, mx.array):
            rows_mask = mask[..., start : start + q.shape[1], :]
            rows_mask = rows_mask[0] if rows_mask.ndim == 4 else rows_mask
            if rows_mask.dtype == mx.bool_:
                visible = visible & rows_mask
            else:
                logits = logits + rows_mask.astype(mx.float32)
        logits = mx.where(visible, logits, mx.array(-mx.inf, dtype=mx.float32))
        total += entropy_sums(_to_torch(mx.softmax(logits, axis=-1, precise=True)))
    return total / rows


def _to_torch(logits: mx.array) -> torch.Tensor:
    return torch.from_numpy(np.array(logits.astype(mx.float32)))
