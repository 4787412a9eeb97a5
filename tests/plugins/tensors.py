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


def exact_attention(query, keys, values, bias, scaling) -> torch.Tensor:
    """softmax(query K^T * scaling + bias) V in float64: query (batch, q_heads, dim), keys and
    values (batch, kv_heads, tokens, dim), GQA by head groups, bias (batch, kv_heads, tokens)."""
    groups = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(groups, 1)
    v = values.double().repeat_interleave(groups, 1)
    logits = torch.einsum("bhd,bhtd->bht", query.double(), k) * scaling
    if bias is not None:
        logits = logits + bias.double().repeat_interleave(groups, 1)
    return torch.einsum("bht,bhtd->bhd", torch.softmax(logits, -1), v)


# Relative error bounds of a fused decode attention against exact_attention over the decoded K/V.
# float32: the order of the sums. 16-bit: the query, the softmax weights and the output are
# rounded to the dtype (2^-9 relative in bfloat16); turbo's rotated-domain keys and values add
# their own rounding.
ATTENTION_TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}
