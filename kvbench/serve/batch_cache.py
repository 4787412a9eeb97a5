"""One decode step of several requests as one batched forward of a transformers model.

Each request keeps its own KVBenchCache (one method policy per layer, batch size 1). BatchStep
is a transformers Cache over the same layer of every request: a row's new key and value go to
that row's policy, and attention gets every row's keys and values right-padded to the longest,
with a padding mask (and each row's key bias, where its policy has one) handed to kvbench's
attention (kvbench.models.attention.BatchHandoff). RoPE positions come per row from the tokens
each policy has seen (the caller passes them as position_ids), so rows of any length, evicted or
compacted, decode together.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.models.attention import BatchHandoff, hand_over
from kvbench.models.hf_cache import KVBenchCache
from kvbench.models.policy_totals import check_attention_inputs


class BatchLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, layer_idx: int, caches: list[KVBenchCache]):
        super().__init__()
        self.layer_idx = layer_idx
        self.policies = [cache.layers[layer_idx].policy for cache in caches]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[-2] != 1:
            raise ValueError(f"a batched step feeds one token per row, got {key_states.shape[-2]}")
        rows = []
        for row, policy in enumerate(self.policies):
            policy.append(key_states[row : row + 1], value_states[row : row + 1])
            keys, values, bias = policy.attention_inputs()
            check_attention_inputs(policy, self.layer_idx, keys.shape,
                                   None if bias is None else bias.shape, 1, None)
            rows.append((keys, values, bias))
        lengths = [row_keys.shape[-2] for row_keys, _, _ in rows]
        if all(bias is None for _, _, bias in rows) and len(set(lengths)) == 1:
            # rows of one length need neither padding nor a mask
            hand_over(BatchHandoff(self.layer_idx, self.policies, None, None, lengths))
            return torch.cat([k for k, _, _ in rows]), torch.cat([v for _, v, _ in rows])
        batch, heads, _, dim = key_states.shape
        longest = max(lengths)
        keys = key_states.new_zeros(batch, heads, longest, dim)
        values = value_states.new_zeros(batch, heads, longest, value_states.shape[-1])
        visible = torch.zeros(batch, 1, 1, longest, dtype=torch.bool, device=key_states.device)
        bias = None
        for row, (row_keys, row_values, row_bias) in enumerate(rows):
            length = lengths[row]
            keys[row, :, :length] = row_keys[0]
            values[row, :, :length] = row_values[0]
            visible[row, ..., :length] = True
            if row_bias is not None:
                if bias is None:
                    bias = torch.zeros(batch, heads, longest, device=key_states.device)
                # a per-query bias (1, kv_heads, 1, keys) of a one-token step is a key bias
                bias[row, :, :length] = row_bias[0, :, 0] if row_bias.dim() == 4 else row_bias[0]
        hand_over(BatchHandoff(self.layer_idx, self.policies, visible, bias, lengths))
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # kvbench's attention uses the handed-over padding mask; this only sizes the model's own
        kept = max(p.retained_tokens + p.summary_slots for p in self.policies)
        return kept + query_length, 0

    def get_seq_length(self) -> int:
        return max(policy.seen_tokens for policy in self.policies)

    def get_max_length(self) -> int:
        return -1


class BatchStep(Cache):
    """The cache of one batched decode forward over `caches` (row i is caches[i])."""

    def __init__(self, caches: list[KVBenchCache]):
        layers = [BatchLayer(i, caches) for i in range(len(caches[0].layers))]
        super().__init__(layers=layers)

    @staticmethod
    def positions(caches: list[KVBenchCache]) -> torch.Tensor:
        """(rows, 1): each row's next RoPE position, the tokens its policies have seen."""
        return torch.tensor([[cache.layers[0].policy.seen_tokens] for cache in caches])
