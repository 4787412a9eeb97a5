"""The cache of a transformers model, made of kvbench layer policies (kvbench.models.host): a thin
adapter of transformers' Cache protocol.

Attention reads what the policy returns from attention_inputs(), or at one-token steps the
packed cache itself through the fused decode attention where the policy offers it
(attention_segments): the compressed state itself, no shadow copy. A read that plain SDPA cannot
serve reaches kvbench's attention (kvbench.models.attention) through the forward's
`kvbench_cache` keyword: run the model with forward(). Positions continue from the tokens the
policy has seen, and the causal mask is sized to the keys it actually returns. Batch size 1.

Only the layers a method compresses (full attention: kvbench.models.layer_kinds) hold its
policies; the others are transformers' own layer objects, built as DynamicCache(config=...)
builds them (a sliding window's, a linear-attention or Mamba state), so the model drives them as
it does without kvbench.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.methods.core.contracts import LayerCachePolicy
from kvbench.methods.external.library_prefill import LibraryPrefill
from kvbench.models.footprint import observe
from kvbench.models.host import CacheHost, LayerHost
from kvbench.models.layer_kinds import FULL, HYBRID, SLIDING, LayerKind, hosted_layers
from kvbench.models.part_attention import part_bytes


def with_cache(model, cache) -> dict[str, Any]:
    """The keyword argument by which `model`'s forward takes a cache: `cache` from transformers
    5 (which deprecates `past_key_values`, with a warning at every call), else
    `past_key_values`."""
    return {_cache_keyword(type(model)): cache}


@functools.cache
def _cache_keyword(model_type: type) -> str:
    takes = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in takes else "past_key_values"


def step_length(asked: int | torch.Tensor) -> int:
    """The tokens of the step a mask is sized for: transformers from 5.3 passes their count,
    earlier versions the step's cache_position."""
    return asked if isinstance(asked, int) else asked.shape[0]


class PolicyLayer(LayerHost, CacheLayerMixin):
    """One layer of KVBenchCache: transformers' layer protocol over a LayerHost."""

    is_sliding = False
    arrays = TORCH_ARRAYS

    def __init__(self, policy: LayerCachePolicy, layer_idx: int, owner: "KVBenchCache",
                 unfused: str = ""):
        LayerHost.__init__(self, policy, layer_idx)
        CacheLayerMixin.__init__(self)
        # what it reads of its cache, not the cache itself: a layer pointing back at the cache
        # kept every dropped cache alive until the garbage collector ran
        self._mask_kv_length = owner.mask_kv_length
        self._impl_log = getattr(owner.method, "impl_log", None)  # a recording has none
        # the fused decode attention is plain softmax: not taken under softcap, sinks or MLA
        # (kvbench.models.layer_kinds.LayerKind.unfused_because), which info.impl then says
        self.unfused = unfused

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.part_bytes = part_bytes(self.device)  # kvbench.models.attention reads parts
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if key_states.shape[0] != 1:
            raise NotImplementedError(
                f"KVBenchCache supports batch size 1, got {key_states.shape[0]}"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        read = self.hold(self.append(key_states, value_states,
                                     self._mask_kv_length.get(self.is_sliding),
                                     fused=not self.unfused))
        if self.unfused and key_states.shape[-2] == 1:
            self._note_unfused()
        if read.packed is not None or read.parts is not None:
            return key_states, value_states  # placeholders: attention reads the cache's own
        return read.keys, read.values

    def _note_unfused(self) -> None:
        """A one-token step read without the fused kernels, for what the layer's attention adds
        (softcap, sinks, MLA): the run's info.impl says so."""
        if self._impl_log is not None:
            self._impl_log.note("decode attention", f"torch ({self.unfused}: no fused kernel)")

    def ingest(self, keys, values, queries, buffers=None) -> None:
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        super().ingest(keys, values, queries, buffers)

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' rewind: a negative count of newest tokens to forget."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        wanted = -tokens_to_remove
        dropped = self.trim(wanted) if wanted else 0
        if dropped != wanted:
            raise ValueError(f"layer {self.layer_idx}: {type(self.policy).__name__} can take back"
                             f" only {dropped} of the {wanted} newest tokens")

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        # Keys returned = summaries + retained + new. The offset maps the new keys to their true
        # positions (seen .. seen+q-1) so they stay causal; every retained key lies before them.
        query_length = step_length(query_length)
        kept = self.kept_keys
        return kept + query_length, self.seen_tokens - kept

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def state_bytes(self) -> int:
        """Bytes the library holds beside the policy in this layer (a hybrid's Mamba state)."""
        return 0

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # its name before transformers 5.3


def hybrid_layer_class():
    """PolicyLayer with transformers' linear-attention state beside it: a layer that attends
    and keeps a Mamba state (Falcon-H1), as transformers' LinearAttentionAndFullAttentionLayer
    is its DynamicLayer with that state."""
    from transformers.cache_utils import LinearAttentionLayer

    class HybridPolicyLayer(LinearAttentionLayer, PolicyLayer):
        def __init__(self, policy, layer_idx, owner, unfused="", number_of_states=1):
            PolicyLayer.__init__(self, policy, layer_idx, owner, unfused)
            LinearAttentionLayer.__init__(self, number_of_states=number_of_states)

        def lazy_initialization(self, *args, **kwargs) -> None:
            if len(args) == 2 and not kwargs:  # the attention's update
                PolicyLayer.lazy_initialization(self, *args)
            elif not args:  # update_conv_state / update_recurrent_state
                LinearAttentionLayer.lazy_initialization(self, **kwargs)

        def crop(self, tokens_to_remove: int) -> None:
            LinearAttentionLayer.crop(self, tokens_to_remove)
            PolicyLayer.crop(self, tokens_to_remove)

        get_seq_length = PolicyLayer.get_seq_length
        get_max_length = PolicyLayer.get_max_length
        get_mask_sizes = PolicyLayer.get_mask_sizes

        def state_bytes(self) -> int:
            return held_bytes(self)  # its tensors are the conv and recurrent states

    return HybridPolicyLayer


class KVBenchCache(CacheHost, Cache):
    """The cache of a transformers model, one `method.new_layer_cache(i)` per layer it compresses
    (method: a method's torch implementation), transformers' own layer for every other (kinds:
    kvbench.models.layer_kinds, read from `config`; None: every layer full attention);
    decoded_reads as kvbench.models.host.CacheHost."""

    def __init__(self, method: Any, num_layers: int, decoded_reads: bool = False,
                 config: Any = None, kinds: list[LayerKind] | None = None):
        # keys the model's one shared mask of each layer type was sized for, by is_sliding
        self.mask_kv_length: dict[bool, int] = {}
        self.method = method
        kinds = kinds or [None] * num_layers
        own = transformers_layers(config, kinds)
        hosted = (set(range(num_layers)) if None in kinds
                  else set(hosted_layers(method, kinds)))
        # sliding windows a quantizer holds (kvbench.methods.core.window_cache)
        windows = {i: kind.window for i, kind in enumerate(kinds)
                   if i in hosted and kind is not None and kind.mixer == SLIDING}

        def make_layer(policy, i):
            kind = kinds[i]
            if kind is None:
                return PolicyLayer(policy, i, self)
            if i in windows:  # the model's sliding mask is sized from it, as from its own
                layer = PolicyLayer(policy, i, self, kind.unfused_because())
                layer.is_sliding = True
                return layer
            if kind.mixer == HYBRID:
                return hybrid_layer_class()(policy, i, self, kind.unfused_because(),
                                            own[i].number_of_states)
            if kind.index_topk:  # the indexer's keys beside the policy (DeepSeek-V3.2)
                from kvbench.models.indexed_layer import indexed_layer_class

                return indexed_layer_class(PolicyLayer)(policy, i, self, kind.unfused_because())
            return PolicyLayer(policy, i, self, kind.unfused_because())

        library = {i: own[i] for i, kind in enumerate(kinds)
                   if kind is not None and i not in hosted}
        readers = {i: kind.reads for i, kind in enumerate(kinds)
                   if kind is not None and kind.reads is not None}
        CacheHost.__init__(self, method, num_layers, make_layer, decoded_reads, library, readers,
                           windows)
        Cache.__init__(self, layers=self.layers)
        self.last_updated: int | None = None

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        # the layer whose attention comes next, for a module shared by several depths
        self.last_updated = layer_idx
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen, the next RoPE position: a policy's count, where the model keeps the first
        layer's state outside its layer object (MiniMax's linear layers, whose layer counts
        nothing)."""
        if layer_idx == 0 and self.hosts:
            return self.hosts[0].seen_tokens
        return super().get_seq_length(layer_idx)

    def attending_layer(self, module_layer: int | None) -> int | None:
        """The layer whose cache an attention module reads: its own, or for one module shared
        by several depths (Zamba 2's attention block, layer_idx -1) the layer just updated."""
        return self.last_updated if module_layer is None or module_layer < 0 else module_layer

    def get_mask_sizes(self, query_length: int | torch.Tensor, layer_idx: int) -> tuple[int, int]:
        sizes = super().get_mask_sizes(query_length, layer_idx)
        # The model builds one mask per layer type (from its first layer) and shares it with
        # every layer of that type; a library layer's (a sliding window's) is its own.
        layer = self.layers[layer_idx]
        if isinstance(layer, LayerHost):
            self.mask_kv_length[layer.is_sliding] = sizes[0]
        return sizes

    def library_bytes(self) -> int:
        """The library's layers, and the linear-attention state of hybrid policy layers."""
        return (sum(held_bytes(layer) for layer in self.library_layers)
                + sum(host.state_bytes() for host in self.hosts))

    def forward(self, model, ids: torch.Tensor, **kwargs) -> Any:
        """`model` run on `ids` through this cache, its attention handed the cache's reads; a
        prompt's first forward run by the method's library where it runs it (LibraryPrefill)."""
        if isinstance(self.method, LibraryPrefill) and self.get_seq_length() == 0:
            output = self.method.prefill_forward(model, ids, self.policies, **kwargs)
            for layer in self.layers:
                layer.filled_elsewhere()
        else:
            output = model(ids, **with_cache(model, self), use_cache=True, kvbench_cache=self,
                           **kwargs)
        observe(self)  # the case's footprint: the cache's size as each forward ends
        return output

    def end_prefill(self) -> None:
        observe(self, settled=True)  # before compaction too: an ingested prompt is held whole
        super().end_prefill()
        observe(self, settled=True)

    def crop(self, *args, **kwargs) -> None:
        super().crop(*args, **kwargs)
        observe(self, settled=True)


def transformers_layers(config: Any, kinds: list[LayerKind | None]) -> list | None:
    """transformers' own layer objects, one per layer, as DynamicCache(config=config) builds
    them, where some layer needs its own (a library-hosted layer, a hybrid's state); else None."""
    if all(kind is None or kind.mixer == FULL for kind in kinds):
        return None
    import transformers

    layers = transformers.DynamicCache(config=config).layers
    if len(layers) != config.get_text_config(decoder=True).num_hidden_layers:
        raise ValueError(
            f"transformers {transformers.__version__} builds no cache layer per layer of this"
            " model from its config (linear-attention and Mamba layers need transformers 5.3"
            " or later); kvbench hosts its layers as that cache does")
    return layers


def held_bytes(layer: Any) -> int:
    """Bytes of the tensors a library layer holds: its keys and values, its conv and recurrent
    states (bookkeeping attributes, named with a leading underscore, left out)."""
    return sum(tensor_bytes(value) for name, value in vars(layer).items()
               if not name.startswith("_"))


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor, or of the tensors in a dict or list of them (one level)."""
    items = value.values() if isinstance(value, dict) else \
        value if isinstance(value, (list, tuple)) else [value]
    return sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))
