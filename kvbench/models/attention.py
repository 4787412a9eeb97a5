"""kvbench's attention function for transformers models: SDPA, unless the cache layer that was
just updated asks for an additive key bias or sparse-V, wants to see the queries, or hands over
its packed cache for the fused decode attention (FusedHandoff).

Models are loaded with attn_implementation="kvbench". A KVBenchCache layer whose policy returns a
bias, turns sparse-V on or observes queries calls hand_over() in its update(); the attention call
that follows in the same module reads and clears it. With nothing handed over (a DynamicCache, or
a policy with none of these), this is exactly transformers' SDPA attention, so the identity method
stays bit-exact; a policy that only observes queries also gets SDPA's output.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvbench.methods.core.contracts import LayerCachePolicy

NAME = "kvbench"


@dataclass
class Handoff:
    """What one layer's attention must add to plain softmax attention."""

    layer_idx: int
    policy: LayerCachePolicy  # its value_skip_threshold turns sparse-V on; it records the skips
    # (batch, kv_heads, keys): added to the logits of every query; (batch, kv_heads, queries,
    # keys): the policy's own visibility, added instead of the model's causal mask
    bias: torch.Tensor | None


@dataclass
class FusedHandoff:
    """A one-token step whose attention reads the layer's packed cache directly
    (LayerCachePolicy.attention_segments; kvbench.kernels.triton.attention)."""

    layer_idx: int
    segments: list  # kvbench.kernels.formats.KVSegment, in token order


@dataclass
class BatchHandoff:
    """One layer of a batched decode step (kvbench.serve.batch_cache): rows' keys are padded to
    the longest; this says which keys each row sees and adds each row's key bias."""

    layer_idx: int
    policies: list[LayerCachePolicy]  # one per row
    visible: torch.Tensor | None  # bool (rows, 1, 1, keys): False for a row's padding (None:
    # every row has all the keys)
    bias: torch.Tensor | None  # (rows, kv_heads, keys), or None when no row has one
    lengths: list[int]  # keys each row really has


_pending = threading.local()


def hand_over(handoff: Handoff) -> None:
    """Called by a cache layer's update(); raises if the previous handoff was never read."""
    if getattr(_pending, "value", None) is not None:
        _pending.value = None
        raise RuntimeError(
            "the model's attention did not read the kvbench cache's key bias / sparse-V state;"
            f" load the model with attn_implementation={NAME!r} (kvbench.models.load_model does)"
        )
    _pending.value = handoff


def drop_pending() -> None:
    """Forget a handoff left by a forward that failed between its cache update and attention,
    so it cannot be taken for the next model's (a new cache calls this)."""
    _pending.value = None


def kvbench_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    handoff, _pending.value = getattr(_pending, "value", None), None
    if handoff is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    if isinstance(handoff, BatchHandoff):
        return _batched_attention(module, handoff, query, key, value, scaling, dropout, **kwargs)
    if isinstance(handoff, FusedHandoff):
        return _fused_attention(module, handoff, query, scaling)
    if handoff.layer_idx != module.layer_idx:
        raise RuntimeError(f"attention of layer {module.layer_idx} got the cache state of layer"
                           f" {handoff.layer_idx}")
    policy = handoff.policy
    if handoff.bias is None and not policy.value_skip_threshold:
        out = sdpa_attention_forward(module, query, key, value, attention_mask,
                                     dropout=dropout, scaling=scaling, **kwargs)
    else:
        out, sparse = biased_attention(query, key, value, attention_mask, handoff.bias, scaling,
                                       policy.value_skip_threshold)
        if sparse is not None:
            policy.record_sparse_v(*sparse)
        out = (out.transpose(1, 2).contiguous(), None)
    if policy.observes_queries:
        policy.observe_queries(query)
    return out


def _fused_attention(module, handoff: FusedHandoff, query, scaling):
    """The decode step over the packed cache: the keys and values the layer returned are
    placeholders; no causal mask is needed for the one newest query."""
    if handoff.layer_idx != module.layer_idx:
        raise RuntimeError(f"attention of layer {module.layer_idx} got the packed cache of layer"
                           f" {handoff.layer_idx}")
    from kvbench.kernels.triton.attention import decode_attention

    out = decode_attention(query, handoff.segments, scaling=scaling)
    return out.transpose(1, 2).contiguous(), None


def _batched_attention(module, handoff: BatchHandoff, query, key, value, scaling, dropout,
                       **kwargs):
    """A batched one-token step: the padding mask replaces the model's; each row's policy gets
    what a batch-1 step would give it (sparse-V on its own keys, its queries)."""
    if handoff.layer_idx != module.layer_idx:
        raise RuntimeError(f"attention of layer {module.layer_idx} got the batched cache state of"
                           f" layer {handoff.layer_idx}")
    if handoff.bias is None:
        out = sdpa_attention_forward(module, query, key, value, handoff.visible,
                                     dropout=dropout, scaling=scaling, **kwargs)[0]
    else:
        out = biased_attention(query, key, value, handoff.visible, handoff.bias,
                               scaling)[0].transpose(1, 2)
    for row, policy in enumerate(handoff.policies):
        if policy.value_skip_threshold:  # its skip statistics must not count the padding
            length = handoff.lengths[row]
            row_bias = None if handoff.bias is None else handoff.bias[row : row + 1, :, :length]
            sparse, stats = biased_attention(
                query[row : row + 1], key[row : row + 1, :, :length],
                value[row : row + 1, :, :length], None, row_bias, scaling,
                policy.value_skip_threshold)
            policy.record_sparse_v(*stats)
            out[row] = sparse[0].transpose(0, 1)
        if policy.observes_queries:
            policy.observe_queries(query[row : row + 1])
    return out.contiguous(), None


def biased_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, bias: torch.Tensor | None,
                     scaling: float | None = None, skip_below: float = 0.0):
    """softmax(q k^T * scaling + mask + bias) v in float32, GQA by head groups.

    query (B, Hq, q, D); key, value (B, Hkv, T, D); bias (B, Hkv, T) or None; mask bool (True =
    attend) or additive, broadcastable to (B, Hq, q, T), or None: causal, as SDPA's is_causal,
    with the q queries at the last q positions. A bias (B, Hkv, q, T) is per query and replaces
    the mask: it is the policy's own visibility (-inf = hidden), causality included.
    With skip_below > 0 and a single query, value rows whose weight is below it are left out of
    the sum (no renormalisation, as sparse-V kernels skip them).
    Returns (output in query's dtype, None or (rows skipped, rows, mean relative squared error
    of the output against the dense sum)).
    """
    groups = query.shape[1] // key.shape[1]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    logits = query.float() @ k.transpose(-1, -2) * scaling
    queries, keys = query.shape[-2], key.shape[-2]
    if bias is not None and bias.dim() == 4:
        mask, bias = bias.float().repeat_interleave(groups, dim=1), None
    if mask is None and queries > 1:
        # SDPA's is_causal case: the new queries are the last ones, every earlier key is visible
        offset = keys - queries
        mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(offset)
    if mask is not None:
        mask = mask[..., :keys]
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    if bias is not None:
        logits = logits + bias.float().repeat_interleave(groups, dim=1).unsqueeze(-2)
    weights = torch.softmax(logits, dim=-1)
    out = weights @ v
    if not skip_below or queries != 1:
        return out.to(query.dtype), None
    skipped = weights < skip_below
    sparse = weights.masked_fill(skipped, 0.0) @ v
    error = (sparse - out).square().sum(-1) / out.square().sum(-1).clamp_min(1e-30)
    return sparse.to(query.dtype), (skipped.sum().item(), skipped.numel(), error.mean().item())


AttentionInterface.register(NAME, kvbench_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
