"""Attention over a cache's parts (LayerCachePolicy.attention_parts), one part at a time and
within it one block of keys at a time: each block's softmax merged into the running one by its
maximum and sum, as flash attention merges its tiles, so a read holds one decoded part and one
block's float32 weights, never the layer's keys and values joined.

Rounding: the merged softmax is not SDPA's; in float32 the outputs agree to ~1e-6 of their
scale (tests/test_part_attention.py bounds it). Only reads too large to be read whole come in
parts (part_bytes), so short contexts keep SDPA's bits.
"""
from __future__ import annotations

import math

import torch

from kvbench.methods.core.read_parts import READ_PART_BYTES
from kvbench.models.biased_attention import grouped_matmul

# On CUDA a part, and a block's float32 weights, take a sixteenth of the free memory, within
# READ_PART_BYTES (the CPU's) and PART_BYTES_MAX: a long context's layer is read whole there,
# by SDPA, where it fits.
PART_BYTES_MAX = 2**30
FREE_SHARE = 16


def part_bytes(device: torch.device) -> int:
    """The bytes of a part of a read on `device` (LayerCachePolicy.attention_parts), and of the
    float32 weights of a block of keys within it."""
    if device.type != "cuda":
        return READ_PART_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return min(max(free // FREE_SHARE, READ_PART_BYTES), PART_BYTES_MAX)


def part_attention(query: torch.Tensor, parts: list, mask: torch.Tensor | None,
                   keys: int, scaling: float | None = None, softcap: float | None = None,
                   sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v over the keys and values of `parts` (ReadParts, in
    token order), `keys` of them in all: (batch, query heads, queries, head_dim) in query's
    dtype.

    query (B, Hq, q, D), each part's keys and values (B, Hkv, t, D): query head h reads KV head
    h // (Hq // Hkv). mask: bool (True = attend) or additive, broadcastable to (B, 1, q, keys),
    or None: causal, the queries at the last q positions. softcap and sinks as the model's own
    attention applies them (kvbench.models.biased_attention)."""
    batch, heads, queries, dim = query.shape
    scaling = dim ** -0.5 if scaling is None else scaling
    shape = (batch, heads, queries, 1)
    high = query.new_full(shape, -math.inf, dtype=torch.float32)  # the running maximum
    total = query.new_zeros(shape, dtype=torch.float32)
    out = query.new_zeros((batch, heads, queries, dim), dtype=torch.float32)
    block = max(1, part_bytes(query.device) // (batch * heads * queries * 4))
    q = query.float() * scaling
    start = 0
    for part in parts:
        part_keys, part_values = part.make()
        for at in range(0, part_keys.shape[-2], block):
            k = part_keys[..., at : at + block, :]
            # one block of float32 weights held: every step on it is in place
            logits = grouped_matmul(q, k.float().transpose(-1, -2))
            if softcap:
                logits.div_(softcap).tanh_().mul_(softcap)
            _mask(logits, mask, start, queries, keys)
            high, scale = _raised(high, logits.amax(-1, keepdim=True))
            weights = logits.sub_(_finite(high)).exp_()
            total.mul_(scale).add_(weights.sum(-1, keepdim=True))
            v = part_values[..., at : at + block, :]
            out.mul_(scale).add_(grouped_matmul(weights, v.float()))
            start += k.shape[-2]
    if start != keys:
        raise RuntimeError(f"attention parts held {start} keys, the read reported {keys}")
    if sinks is not None:  # one more logit per head, with no value
        sink = sinks.float().reshape(1, -1, 1, 1)
        high, scale = _raised(high, sink)
        total.mul_(scale).add_(torch.exp(sink - _finite(high)))
        out.mul_(scale)
    return (out / total).to(query.dtype)


def _mask(logits: torch.Tensor, mask: torch.Tensor | None, start: int, queries: int,
          keys: int) -> None:
    """Put the read's mask (None: causal) on `logits` of keys start .. start + n, in place."""
    n = logits.shape[-1]
    if mask is None:
        if start + n <= keys - queries + 1:
            return  # every query sees every key of the block
        position = torch.arange(keys - queries, keys, device=logits.device)[:, None]
        mask = position >= torch.arange(start, start + n, device=logits.device)[None]
    else:
        mask = mask[..., start : start + n]
    if mask.dtype == torch.bool:
        logits.masked_fill_(~mask, -math.inf)
    else:
        logits.add_(mask)


def _raised(high: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the running maximum raised to `new`, the factor that rescales what was summed under the
    old one)."""
    raised = torch.maximum(high, new)
    return raised, torch.exp(high - _finite(raised))


def _finite(high: torch.Tensor) -> torch.Tensor:
    """A maximum with -inf (every key so far hidden) read as 0: exp(-inf - 0) = 0, no NaN."""
    return high.masked_fill(high == -math.inf, 0.0)
