"""Seeded inputs and codec round trips shared by the method tests (plain functions: import them)."""
from __future__ import annotations

import torch


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values drawn in float32 from a generator seeded with `seed`, then cast to
    `dtype`: the same draw whatever the dtype, to its precision."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def token_ids(n: int, seed: int = 3) -> torch.Tensor:
    """(1, n) token ids below 256 (the tiny models' vocabulary), from a seeded generator."""
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def round_trip(method, x: torch.Tensor) -> torch.Tensor:
    """x encoded and decoded by the method's codec (`method`: a method's settings, run as their
    torch implementation, or an implementation)."""
    from kvbench.methods import implementation
    from kvbench.methods.settings.base import MethodSettings

    if isinstance(method, MethodSettings):
        method = implementation(method)
    codec = method.codec()
    return codec.decode(codec.encode(x))


def exact_attention(query, keys, values, bias, scaling, softcap=None, sinks=None,
                    window=None) -> torch.Tensor:
    """softmax(query K^T * scaling + bias) V in float64: query (batch, q_heads, dim), keys and
    values (batch, kv_heads, tokens, dim), GQA by head groups, bias (batch, kv_heads, tokens).
    As kvbench.models.attention.biased_attention: softcap, the logits become softcap *
    tanh(logits / softcap) before the bias; sinks (q_heads,), one more logit per query head
    with no value. window: only the newest `window` keys are attended."""
    groups = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(groups, 1)
    v = values.double().repeat_interleave(groups, 1)
    logits = torch.einsum("bhd,bhtd->bht", query.double(), k) * scaling
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if bias is not None:
        logits = logits + bias.double().repeat_interleave(groups, 1)
    if window is not None:
        logits[..., : max(0, logits.shape[-1] - window)] = -float("inf")
    if sinks is not None:
        sink = sinks.double().reshape(1, -1, 1).expand(*logits.shape[:-1], 1)
        weights = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
    else:
        weights = torch.softmax(logits, -1)
    return torch.einsum("bht,bhtd->bhd", weights, v)


# Relative error bounds of a fused decode attention against exact_attention over the decoded K/V.
# float32: the order of the sums. 16-bit: the query, the softmax weights and the output are
# rounded to the dtype (2^-9 relative in bfloat16); turbo's rotated-domain keys and values add
# their own rounding.
ATTENTION_TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}


def decode_attention_inputs(shape: tuple[int, ...], dtype: torch.dtype, codec=None, fmt=None,
                            reference=None, device: str | torch.device = "cpu"):
    """Fresh inputs of a fused decode attention test, seeded by the shape: a query (batch,
    q_heads, dim), a segment of `tokens` keys and values (packed by `codec` in kernel format
    `fmt`; raw without a codec) and a raw tail of 3; the decoded K/V of all of them (decoded by
    `reference`, default `codec`) and a float32 bias that hides every 4th key but the newest.
    shape: (batch, q_heads, kv_heads, tokens, dim). Returns (query, segments, keys, values,
    bias)."""
    from kvbench.kernels.formats import KVSegment

    batch, q_heads, kv_heads, tokens, dim = shape
    seed = tokens * 31 + dim

    def draw(*size, offset, as_dtype=dtype):
        return randn(*size, seed=seed + offset, dtype=as_dtype).to(device)

    query = draw(batch, q_heads, dim, offset=0)
    keys, values = draw(batch, kv_heads, tokens, dim, offset=1), draw(batch, kv_heads, tokens, dim,
                                                                       offset=2)
    tail = (draw(batch, kv_heads, 3, dim, offset=3), draw(batch, kv_heads, 3, dim, offset=4))
    if codec is None:
        segments, decoded = [KVSegment(keys, values)], (keys, values)
    else:
        pk, pv = codec.encode(keys), codec.encode(values)
        segments = [KVSegment(pk.tensors, pv.tensors, fmt, fmt)]
        decoded = ((reference or codec).decode(pk), (reference or codec).decode(pv))
    segments.append(KVSegment(*tail))
    bias = draw(batch, kv_heads, tokens + 3, offset=5, as_dtype=torch.float32)
    bias[..., ::4] = -float("inf")
    bias[..., -1] = 0.0
    return (query, segments, torch.cat([decoded[0], tail[0]], 2),
            torch.cat([decoded[1], tail[1]], 2), bias)


def cache_read_inputs(shape: tuple[int, ...], dtype: torch.dtype, codec=None, fmt=None,
                      reference=None, device: str | torch.device = "cpu"):
    """decode_attention_inputs' segments as a cache hands them at a decode step: its packed
    block and raw tail, then the step's own token as a one-token raw segment (the bias shows
    it). Returns (query, segments, keys, values, bias)."""
    from kvbench.kernels.formats import KVSegment

    query, segments, keys, values, bias = decode_attention_inputs(shape, dtype, codec, fmt,
                                                                  reference, device)
    batch, _, kv_heads, tokens, dim = shape
    step = [randn(batch, kv_heads, 1, dim, seed=tokens * 31 + dim + i, dtype=dtype).to(device)
            for i in (6, 7)]
    bias = torch.cat([bias, bias.new_zeros(batch, kv_heads, 1)], 2)
    return (query, [*segments, KVSegment(*step)], torch.cat([keys, step[0]], 2),
            torch.cat([values, step[1]], 2), bias)
