"""A transformers Cache whose per-layer storage is a kvbench LayerCachePolicy.

Attention reads what the policy returns from attention_inputs(), or at one-token steps the
packed cache itself through the fused decode attention where the policy offers it
(attention_segments): the compressed state itself, no shadow copy; a key bias, sparse-V or the
packed cache reaches the model's attention through kvbench.models.attention. Positions continue
from the tokens the policy has seen, and the causal mask is sized to the keys it actually
returns. Batch size 1.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.methods.core.contracts import LayerCachePolicy, Implementation
from kvbench.models.attention import FusedHandoff, Handoff, drop_pending, hand_over
from kvbench.models.policy_totals import PolicyTotals, check_attention_inputs


class PolicyLayer(CacheLayerMixin):
    """One layer of KVBenchCache: appends to the policy and hands attention what it retains."""

    is_sliding = False

    def __init__(self, policy: LayerCachePolicy, layer_idx: int, owner: "KVBenchCache"):
        super().__init__()
        self.policy = policy
        self.layer_idx = layer_idx
        self._owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if key_states.shape[0] != 1:
            raise NotImplementedError(
                f"KVBenchCache supports batch size 1, got {key_states.shape[0]}"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.policy.append(key_states, value_states)
        policy = self.policy
        if (key_states.shape[-2] == 1 and not policy.value_skip_threshold
                and not policy.observes_queries):
            segments = policy.attention_segments()
            if segments is not None:
                tokens = sum(segment.tokens for segment in segments)
                check_attention_inputs(policy, self.layer_idx,
                                       (*key_states.shape[:-2], tokens, key_states.shape[-1]),
                                       None, 1, self._owner.mask_kv_length)
                hand_over(FusedHandoff(self.layer_idx, segments))
                return key_states, value_states  # placeholders: attention reads the segments
        keys, values, bias = policy.attention_inputs()
        check_attention_inputs(policy, self.layer_idx, keys.shape,
                               None if bias is None else bias.shape, key_states.shape[-2],
                               self._owner.mask_kv_length)
        if bias is not None or policy.value_skip_threshold or policy.observes_queries:
            hand_over(Handoff(self.layer_idx, policy, bias))
        return keys, values

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' rewind: a negative count of newest tokens to forget."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        wanted = -tokens_to_remove
        dropped = self.policy.trim(wanted) if wanted else 0
        if dropped != wanted:
            raise ValueError(f"layer {self.layer_idx}: {type(self.policy).__name__} can take back"
                             f" only {dropped} of the {wanted} newest tokens")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if not self.is_initialized:  # a policy need not answer before its first append
            return query_length, 0
        # Keys returned = summaries + retained + new. The offset maps the new keys to their true
        # positions (seen .. seen+q-1) so they stay causal; every retained key lies before them.
        policy = self.policy
        kept = policy.retained_tokens + policy.summary_slots
        return kept + query_length, policy.seen_tokens - kept

    def get_seq_length(self) -> int:
        return self.policy.seen_tokens if self.is_initialized else 0

    def get_max_length(self) -> int:
        return -1


class KVBenchCache(PolicyTotals, Cache):
    """The cache of a transformers model, made of one `method.new_layer_cache(i)` per layer.

    decoded_reads: ask every layer's policy for its decoded-once read path
    (LayerCachePolicy.keep_decoded: the same attention inputs, bit for bit, without decoding the
    packed cache at every step); the attribute `decoded_reads` then says whether any policy took
    it, i.e. which path runs."""

    def __init__(self, method: Implementation, num_layers: int, decoded_reads: bool = False):
        self.mask_kv_length: int | None = None  # keys the model's one shared mask was sized for
        layers = [PolicyLayer(method.new_layer_cache(i), i, self) for i in range(num_layers)]
        super().__init__(layers=layers)
        self.decoded_reads = decoded_reads and any(
            [layer.policy.keep_decoded() for layer in layers])
        drop_pending()

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        sizes = super().get_mask_sizes(query_length, layer_idx)
        # The model builds one mask (from one layer) and shares it with every layer.
        self.mask_kv_length = sizes[0]
        return sizes
