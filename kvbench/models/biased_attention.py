"""The attention that kvbench computes itself where the library's cannot serve a read (a policy's
bias, sparse-V's skipped rows, the model's softcap or sinks), written once for both backends:
`arrays` (kvbench.backends.arrays.Arrays) makes each step the call that backend's attention
made (torch's in kvbench.models.attention, the float reference; MLX's in
kvbench.models.mlx_attention), so the order of float operations is each one's own.
"""
from __future__ import annotations

import math
from typing import Any

from kvbench.backends.arrays import Arrays


def biased_attention(arrays: Arrays, query: Any, key: Any, value: Any, mask: Any, bias: Any,
                     scaling: float | None = None, skip_below: float = 0.0,
                     softcap: float | None = None, sinks: Any = None):
    """softmax(q k^T * scaling + mask + bias) v in float32, GQA by head groups.

    query (B, Hq, q, D); key, value (B, Hkv, T, D); bias (B, Hkv, T) or None; mask bool (True =
    attend) or additive, broadcastable to (B, Hq, q, T); None: causal, as SDPA's is_causal, with
    the q queries at the last q positions (no mask for one query); "causal" (mlx-lm's): the same.
    A bias (B, Hkv, q, T) is per query and replaces the mask: it is the policy's own visibility
    (-inf = hidden), causality included.
    softcap: the logits q k^T * scaling become softcap * tanh(logits / softcap) first (Gemma 2).
    sinks (Hq,): one more logit per query head that takes its share of the softmax and adds no
    value (gpt-oss's s_aux).
    With skip_below > 0 and a single query, value rows whose weight is below it are left out of
    the sum (no renormalisation, as sparse-V kernels skip them).
    Returns (output in query's dtype, None or (rows skipped, rows, mean relative squared error
    of the output against the dense sum)).
    """
    float32 = arrays.float32
    groups = query.shape[1] // key.shape[1]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    k, v = arrays.cast(key, float32), arrays.cast(value, float32)
    # a group's query heads stacked against their KV head: no copy of K or V per query head
    logits = grouped_matmul(arrays.cast(query, float32), k.swapaxes(-1, -2)) * scaling
    if softcap:
        logits = arrays.tanh(logits / softcap) * softcap
    queries, keys = query.shape[-2], key.shape[-2]
    if bias is not None and bias.ndim == 4:
        mask, bias = arrays.repeat(arrays.cast(bias, float32), groups, axis=1), None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        mask = None if queries == 1 else arrays.causal_mask(queries, keys, like=query)
    elif mask is None and queries > 1:
        mask = arrays.causal_mask(queries, keys, like=query)
    if mask is not None:
        mask = mask[..., :keys]
        if mask.dtype == arrays.bool_:
            logits = arrays.where(mask, logits, -math.inf)
        else:  # added as the torch reference adds it: a narrower float's sum is float32 anyway
            logits = logits + mask
    if bias is not None:
        logits = logits + arrays.repeat(arrays.cast(bias, float32), groups, axis=1)[..., None, :]
    if sinks is not None:
        sink = arrays.broadcast_to(arrays.cast(sinks, float32).reshape(1, -1, 1, 1),
                                   (*logits.shape[:-1], 1))
        weights = arrays.softmax(arrays.concat([logits, sink], axis=-1))[..., :-1]
    else:
        weights = arrays.softmax(logits)
    out = grouped_matmul(weights, v)
    if not skip_below or queries != 1:
        return arrays.cast(out, query.dtype), None
    skipped = weights < skip_below
    sparse = grouped_matmul(arrays.where(skipped, 0.0, weights), v)
    error = (sparse - out).square().sum(-1) / arrays.maximum(out.square().sum(-1), 1e-30)
    return arrays.cast(sparse, query.dtype), (int(skipped.sum().item()),
                                              math.prod(skipped.shape),
                                              float(error.mean().item()))


def grouped_matmul(a: Any, b: Any) -> Any:
    """a @ b per KV head for a's query heads (B, Hq, q, x) and b's KV heads (B, Hkv, x, y):
    query head h reads KV head h // (Hq // Hkv)."""
    batch, heads, queries, _ = a.shape
    kv_heads = b.shape[1]
    stacked = a.reshape(batch, kv_heads, heads // kv_heads * queries, a.shape[-1])
    return (stacked @ b).reshape(batch, heads, queries, b.shape[-1])
