"""mlx-lm's prompt cache made of kvbench policies (the model's loading: kvbench.models.mlx_loading).

MLXKVBenchCache is the MLX twin of kvbench.models.hf_cache.KVBenchCache, a thin adapter of
mlx-lm's prompt-cache protocol (update_and_fetch, offset, make_mask, state, trimming) over the
cache host (kvbench.models.host): attention reads what the policy returns from
attention_inputs(), the compressed state itself, no shadow copy. A key bias, sparse-V or the
queries a policy observes reach mlx-lm's attention through kvbench.models.mlx_attention, which
takes the read from the layer it is handed. RoPE positions come from `offset`, which is the
tokens the policy has seen, so positions continue after eviction or compaction. Batch size 1.
A method that is one of mlx-lm's own caches is hosted so that the model reads what that cache
returns, as under mlx-lm's generate (MLXLibraryLayer).

Only the attention of full-attention and hybrid layers is held by the method's policies (and a
sliding window a quantizer holds: kvbench.methods.core.window_cache, its mask made here as
mlx-lm's RotatingKVCache makes it); every other layer (a sliding window, a linear-attention or
Mamba state: kvbench.models.layer_kinds),
and a hybrid layer's state, is mlx-lm's own cache object for it, as its make_cache() builds it,
which the model drives as it does without kvbench; its arrays count in the cache's bytes as it
holds them.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import mlx.core as mx

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.methods.core.contracts import Codec, LayerCachePolicy
from kvbench.methods.external.mlx_lm_cache import MLXLMLayer
from kvbench.models.footprint import observe
from kvbench.models.host import CacheHost, LayerHost
from kvbench.models.layer_kinds import FULL, HYBRID, SLIDING, LayerKind, hosted_layers
from kvbench.models.mlx_architectures import library_caches, mlx_layer_kind

# Model modules whose Model.__call__ is `self.model(...)` then the (tied or separate) head, so a
# prefill can skip the vocabulary projection of every position but the last, as torch's
# logits_to_keep=1 does. Others compute all logits and slice.
_PLAIN_HEAD = ("mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3")


class MLXPolicyLayer(LayerHost):
    """One layer of MLXKVBenchCache: mlx-lm's prompt-cache protocol over a LayerHost."""

    arrays = MLX_ARRAYS

    def __init__(self, policy: LayerCachePolicy, layer_idx: int, owner: "MLXKVBenchCache",
                 window: int | None = None):
        super().__init__(policy, layer_idx)
        # the cache's dict, not the cache: a layer pointing back at it kept a dropped cache
        # alive until the garbage collector ran
        self._mask_kv_length = owner.mask_kv_length
        self.window = window  # a sliding window's tokens, where a quantizer holds one

    @property
    def offset(self) -> int:
        """RoPE position of the next token: every token seen, kept or not."""
        return self.seen_tokens

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if keys.shape[0] != 1:
            raise NotImplementedError(f"MLXKVBenchCache supports batch size 1, got {keys.shape[0]}")
        # make_mask sized the model's one mask of this layer's kind from the first such layer
        read = self.hold(self.append(keys, values, self._mask_kv_length.get(self.window)))
        return read.keys, read.values

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        """The mask for N new queries over retained + N keys, the queries last (causal; within
        the window where the model asks for one, as mlx-lm's RotatingKVCache makes it)."""
        if window_size is not None and window_size != self.window:
            raise NotImplementedError(
                f"layer {self.layer_idx} holds a method's policy for a window of {self.window},"
                f" but the model asks it for a sliding window's mask of {window_size}; build the"
                " cache with the model and its layer kinds (MLXKVBenchCache(..., model=,"
                " kinds=))")
        retained = self.kept_keys
        self._mask_kv_length[window_size] = retained + N
        if N == 1:
            return None
        if window_size is not None:
            from mlx_lm.models.base import create_causal_mask

            return create_causal_mask(N, retained, window_size=window_size)
        if return_array:
            return mx.arange(retained, retained + N)[:, None] >= mx.arange(retained + N)[None]
        return "causal"  # mx.fast's causal mask puts the queries at the last positions

    @property
    def state(self) -> list[mx.array]:
        """The arrays the policy holds (so `mx.eval(cache.state)` materialises them). A kvbench
        cache cannot be saved and restored through mlx-lm's prompt-cache files."""
        return held_arrays(self.policy)

    @state.setter
    def state(self, value) -> None:
        raise ValueError("a kvbench cache layer cannot be restored from a saved state")

    def is_trimmable(self) -> bool:
        return True  # as far as the policy can: trim() says how many it took back

    def empty(self) -> bool:
        return not self.started

    def size(self) -> int:
        return self.policy.retained_tokens if self.started else 0

    @property
    def nbytes(self) -> int:
        return self.policy.measured_bytes() if self.started else 0


class MLXLibraryLayer(MLXPolicyLayer):
    """A layer whose policy is one of mlx-lm's own caches (kvbench.methods.external.mlx_lm_cache),
    so that the model computes what it computes with that cache under mlx-lm's generate_step.
    The policy's generic read (attention_inputs) cannot give that: mlx-lm's attention
    (mlx_lm.models.base.scaled_dot_product_attention) takes its quantized path, over the
    (codes, scales, biases) that update_and_fetch returns, by hasattr(cache, "bits") on the
    layer object it is handed, which is this one; and the rotating cache's mask has its sliding
    window. So this layer returns the cache's update_and_fetch as it is, makes the cache's own
    mask, and carries the cache's bits and group_size where the cache has them. It never holds
    a read: kvbench's attention (kvbench.models.mlx_attention) passes it to mlx-lm's as is."""

    def __init__(self, policy: MLXLMLayer, layer_idx: int, owner: "MLXKVBenchCache"):
        super().__init__(policy, layer_idx, owner)
        cache = policy.cache
        if hasattr(cache, "bits"):
            self.bits, self.group_size = cache.bits, cache.group_size

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        fetched = self.policy.update_and_fetch(keys, values)
        self.started = True
        return fetched

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        return self.policy.cache.make_mask(N, return_array=return_array, window_size=window_size)

    @MLXPolicyLayer.state.getter
    def state(self) -> list[mx.array]:
        return self.policy.held()

    def is_trimmable(self) -> bool:
        return self.policy.cache.is_trimmable()


class MLXHybridLayer(MLXPolicyLayer):
    """A layer that attends and keeps a Mamba state (Falcon-H1: mlx-lm's CacheList of an
    ArraysCache and a KVCache): the method's policy hosts the attention, mlx-lm's own caches
    the rest. The model indexes it as it indexes that CacheList, the KVCache's place being this
    layer, as transformers' hybrid layer is its attention layer with the state beside it
    (kvbench.models.hf_cache.hybrid_layer_class)."""

    def __init__(self, policy: LayerCachePolicy, layer_idx: int, owner: "MLXKVBenchCache",
                 parts: Any):
        from mlx_lm.models.cache import KVCache

        super().__init__(policy, layer_idx, owner)
        caches = list(getattr(parts, "caches", ()))
        if [type(c) for c in caches].count(KVCache) != 1:
            inside = ", ".join(type(c).__name__ for c in caches)
            raise ValueError(f"layer {layer_idx}: mlx-lm's cache for this hybrid layer is"
                             f" {type(parts).__name__}({inside}), not one KVCache beside its"
                             " state; kvbench cannot host its attention")
        self.parts = [self if type(c) is KVCache else c for c in caches]
        self.library_parts = [c for c in self.parts if c is not self]

    def __getitem__(self, index):
        return self.parts[index]

    @MLXPolicyLayer.state.getter
    def state(self) -> list[mx.array]:
        return [*held_arrays(self.policy),
                *(a for part in self.library_parts for a in layer_arrays(part))]

    def is_trimmable(self) -> bool:
        return all(part.is_trimmable() for part in self.library_parts)

    def trim(self, n: int) -> int:
        for part in self.library_parts:
            part.trim(n)
        return super().trim(n)


class MLXKVBenchCache(CacheHost):
    """The prompt cache of an mlx-lm model, one `method.new_layer_cache(i)` per layer it
    compresses (`method`: a method's MLX implementation, kvbench.methods.implementation(settings,
    "mlx")), mlx-lm's own cache for every other: `model`'s make_cache() entry for that layer
    (kinds: kvbench.models.layer_kinds, MLXLoaded.layer_kinds; None: as that make_cache() says,
    a plain KVCache being full attention; no model: every layer full attention). A hybrid layer
    (attention and a Mamba state) is an MLXHybridLayer: the policy for its attention, mlx-lm's
    own cache for its state. Pass `cache.layers` (or the cache itself) as mlx-lm's `cache=`:
    kvbench's attention takes each layer's read from the layer it is given. A policy that is
    one of mlx-lm's own caches gets an MLXLibraryLayer. decoded_reads as
    kvbench.models.host.CacheHost."""

    def __init__(self, method: Any, num_layers: int, decoded_reads: bool = False,
                 model: Any = None, kinds: list[LayerKind] | None = None):
        self.method = method
        # keys the model's one shared mask of each layer kind was sized for, by window (None:
        # full attention)
        self.mask_kv_length: dict[int | None, int] = {}
        caches, kinds = model_caches(model, kinds, num_layers)
        hosted = set(range(num_layers) if kinds is None else hosted_layers(method, kinds))
        # sliding windows a quantizer holds (kvbench.methods.core.window_cache)
        windows = {i: kind.window for i, kind in enumerate(kinds or [])
                   if i in hosted and kind.mixer == SLIDING}

        def make_layer(policy: LayerCachePolicy, i: int) -> MLXPolicyLayer:
            if isinstance(policy, MLXLMLayer):
                return MLXLibraryLayer(policy, i, self)
            if kinds is not None and kinds[i].mixer == HYBRID:
                return MLXHybridLayer(policy, i, self, caches[i])
            return MLXPolicyLayer(policy, i, self, windows.get(i))

        library = (None if kinds is None else
                   {i: caches[i] for i in range(num_layers) if i not in hosted})
        super().__init__(method, num_layers, make_layer, decoded_reads, library,
                         windows=windows)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index):
        return self.layers[index]

    def __iter__(self):
        return iter(self.layers)

    @property
    def state(self) -> list[mx.array]:
        return [a for layer in self.layers for a in layer_arrays(layer)]

    def end_prefill(self) -> None:
        observe(self, settled=True)  # the case's footprint, before and after compaction
        super().end_prefill()
        observe(self, settled=True)

    def library_bytes(self) -> int:
        """Bytes of the arrays mlx-lm's own caches hold, as they hold them (nbytes: a window's
        buffer, a recurrent state): its layers', and the states beside hybrid layers'
        attention."""
        parts = [part for host in self.hosts for part in getattr(host, "library_parts", ())]
        return sum(library_nbytes(layer) for layer in [*self.library_layers, *parts])


def model_caches(model: Any, kinds: list[LayerKind] | None,
                 num_layers: int) -> tuple[list | None, list[LayerKind] | None]:
    """(mlx-lm's own cache for every layer of `model`, as its make_cache() builds them; the
    layers' kinds: `kinds`, else as those caches say), or (None, None) without a model, where
    every layer must be full attention."""
    if model is None:
        if kinds and not all(kind.mixer == FULL for kind in kinds):
            raise ValueError("this model has layers other than full attention (sliding-window,"
                             " linear-attention or Mamba layers): pass the model, whose"
                             " make_cache() builds mlx-lm's own caches for them")
        return None, None
    caches = library_caches(model)
    kinds = kinds or [mlx_layer_kind(cache) for cache in caches]
    if len(caches) != num_layers or len(kinds) != num_layers:
        raise ValueError(f"the model builds {len(caches)} layer caches and has {len(kinds)}"
                         f" layer kinds for {num_layers} layers")
    return caches, kinds


def layer_arrays(layer: Any) -> list[mx.array]:
    """The arrays one prompt-cache layer holds: a kvbench layer's state, or every array in an
    mlx-lm cache's state (keys and values, a rotating buffer, an ArraysCache's states, a
    CacheList's parts)."""
    from mlx.utils import tree_flatten

    return [a for _, a in tree_flatten(layer.state) if isinstance(a, mx.array)]


def library_nbytes(layer: Any) -> int:
    try:
        return int(layer.nbytes)
    except NotImplementedError:  # a cache class without it: its state's arrays
        return sum(a.nbytes for a in layer_arrays(layer))


def held_arrays(obj: Any, _seen: set[int] | None = None, _depth: int = 0) -> list[mx.array]:
    """Every mx.array reachable from `obj` through policies, codecs, other kvbench objects,
    dataclasses (Packed), lists, tuples and dicts."""
    seen = set() if _seen is None else _seen
    if isinstance(obj, mx.array):
        return [obj]
    if _depth > 8 or id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif (isinstance(obj, (LayerCachePolicy, Codec)) or dataclasses.is_dataclass(obj)
          or type(obj).__module__.startswith("kvbench")):
        children = list(getattr(obj, "__dict__", {}).values())
    else:
        return []
    return [a for child in children for a in held_arrays(child, seen, _depth + 1)]


def mlx_logits(model, ids: mx.array, cache, last_only: bool = False) -> mx.array:
    logits = _logits(model, ids, cache, last_only)
    if isinstance(cache, MLXKVBenchCache):
        observe(cache)  # the case's footprint: the cache's size as each forward ends
    return logits


def _logits(model, ids: mx.array, cache, last_only: bool) -> mx.array:
    layers = cache.layers if isinstance(cache, MLXKVBenchCache) else cache
    if last_only and type(model).__module__ in _PLAIN_HEAD:
        hidden = model.model(ids, layers)[:, -1:, :]
        if model.args.tie_word_embeddings:
            return model.model.embed_tokens.as_linear(hidden)
        return model.lm_head(hidden)
    logits = model(ids, cache=layers)
    return logits[:, -1:, :] if last_only else logits


def cache_arrays(cache) -> list[mx.array]:
    if isinstance(cache, MLXKVBenchCache):
        return cache.state
    return [a for layer in cache for a in layer_arrays(layer)]

