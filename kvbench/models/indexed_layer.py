"""Indexed sparse attention (DeepSeek-V3.2's DSA: transformers' "indexed_attention" layers) as
kvbench hosts it.

Each such layer is MLA (the cache holds the latent: kvbench.models.layer_kinds) plus an indexer
that scores every past position with its own small keys and keeps each query's top
`index_topk`. Here the latent is the method's policy (kvbench.models.hf_cache.PolicyLayer) and
the indexer's key cache sits beside it, transformers' own DynamicIndexedLayer's
(`cache.update_indexer(k, layer_idx)`), its bytes counted as the library's.

transformers' eager and SDPA attention fold the selection into the attention mask; any other
attention function (kvbench's) is handed the selected positions as `indices`, and kvbench's
attention folds them in the same way (selected_mask), on every step: a one-token step past
`index_topk` tokens sees only the selected keys. The selection is of positions, so it indexes
the policy's keys only where the policy keeps every token where it was (the quantizers): a
method that evicts, compacts or adds keys is refused at validate (layer_kinds.refusal), a
policy that does so anyway is an error at its step, and the fused decode read, which reads no
mask, is not taken on these layers (LayerKind.unfused_because).
"""
from __future__ import annotations

import functools

import torch


def selected_mask(mask: torch.Tensor | None, indices: torch.Tensor, keys: int) -> torch.Tensor:
    """`mask` (batch, 1, queries, keys), bool (True: seen) or additive, or None (one query sees
    every key), with only the keys `indices` (batch, queries, top-k) selects left visible, as
    transformers' DeepseekV32Attention folds its indexer's selection for eager and SDPA."""
    batch, queries = indices.shape[:2]
    seen = indices.new_zeros((batch, queries, keys), dtype=torch.bool).scatter(
        -1, indices.long(), True).unsqueeze(1)
    if mask is None:
        return seen
    if mask.dtype == torch.bool:
        return mask & seen
    return mask.masked_fill(~seen, torch.finfo(mask.dtype).min)


@functools.cache
def indexed_layer_class(policy_layer: type) -> type:
    """`policy_layer` (kvbench.models.hf_cache.PolicyLayer) with transformers'
    DynamicIndexedLayer beside it for the indexer's keys (transformers 5.x with DeepSeek-V3.2):
    the cache protocol's calls are the policy layer's (first in the order of bases), except
    update_indexer, which is the library's."""
    from transformers.cache_utils import DynamicIndexedLayer

    class IndexedPolicyLayer(policy_layer, DynamicIndexedLayer):
        def __init__(self, policy, layer_idx: int, owner, unfused: str = ""):
            DynamicIndexedLayer.__init__(self)
            policy_layer.__init__(self, policy, layer_idx, owner, unfused)

        def update(self, key_states, value_states, *args, **kwargs):
            out = policy_layer.update(self, key_states, value_states, *args, **kwargs)
            if self.kept_keys != self.seen_tokens:
                raise RuntimeError(
                    f"layer {self.layer_idx}: {type(self.policy).__name__} hands attention"
                    f" {self.kept_keys} keys after {self.seen_tokens} tokens; the indexer"
                    " selects among every past position, so an indexed layer's policy must"
                    " keep every token where it was (no eviction, compaction or added keys)")
            return out

        def crop(self, tokens_to_remove: int) -> None:
            policy_layer.crop(self, tokens_to_remove)
            if tokens_to_remove and self.is_indexer_initialized:
                self.indexer_keys = self.indexer_keys[:, :tokens_to_remove]

        def state_bytes(self) -> int:
            """The indexer's keys, held beside the policy (library bytes)."""
            return self.indexer_keys.nbytes if self.is_indexer_initialized else 0

    return IndexedPolicyLayer
