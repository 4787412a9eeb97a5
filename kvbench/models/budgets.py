"""How much a case takes at once, sized by the device it runs on rather than by the machine
kvbench was built on: the tokens of one prefill forward, and the sequences decoded together."""
from __future__ import annotations

from typing import Any

# A prefill forward's transient activations may take this share of the device's free memory
# (the rest: the caches, their growth, the other rows of a group).
PREFILL_SHARE = 8
# ... and at most this share of the plain cache at the prompt's length, or CHUNK_FLOOR_BYTES where
# that is more (a short prompt stays one forward): what the evaluation adds to a long context
# stays a small part of the cache it evaluates (a case's eval_overhead).
CACHE_SHARE = 8
CHUNK_FLOOR_BYTES = 128 << 20
# Bytes a forward's attention mask takes per query and key it spans: the causal mask (bool) and
# the additive copy the attention makes of it (measured ~9 on the CPU).
MASK_BYTES = 10
# Tokens per prefill forward, at least (fewer starves the matrix products: 128 was 11% slower
# than 512 on the CPU at 8k) and at most (more gains little speed and its activations grow).
MIN_CHUNK, MAX_CHUNK = 128, 8192
# Decode groups: their caches' plain K+V may take this share of the free memory when the group
# is planned, and at most MAX_ROWS rows (one-token steps are bound by reading the weights; past
# a few dozen rows a step gains little).
DECODE_SHARE = 4
MAX_ROWS = 16
# A server's chunk also bounds how long the other streams wait for their next decode step: at
# most this many tokens a forward (512 on a CPU, where they already take seconds).
SERVE_MAX_CHUNK = {"cpu": 512, "accelerator": 2048}


def activation_bytes_per_token(config: Any, element_size: int) -> int:
    """The transient bytes one prompt token takes inside one layer's forward, from the model's
    config (transformers' or mlx-lm's arguments): its residual stream and attention projections,
    and the MLP's widest intermediate (an MoE's routed experts' together)."""
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = int(getattr(config, "head_dim", 0) or 0) or (hidden // heads if heads else 0)
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or 0) or heads
    dense = int(getattr(config, "intermediate_size", 0) or 0)
    routed = int(getattr(config, "moe_intermediate_size", 0) or 0) * int(
        getattr(config, "num_experts_per_tok", 0) or 0)
    attention = (heads + 2 * kv_heads) * head_dim * 2  # q, k, v and their rotated copies
    return max(1, (4 * hidden + attention + 3 * max(dense, routed)) * element_size)


def prefill_chunk(per_token_bytes: int, free_bytes: int, context: int = 0,
                  plain_cache_bytes: int = 0) -> int:
    """Tokens per prefill forward of a prompt of `context` tokens, whose plain cache holds
    `plain_cache_bytes`: a power of two whose activations and attention mask fit PREFILL_SHARE
    of the free memory and, for a known context, CACHE_SHARE of the plain cache (at least
    CHUNK_FLOOR_BYTES), within [MIN_CHUNK, MAX_CHUNK]."""
    per_token = max(1, per_token_bytes + MASK_BYTES * context)
    budget = free_bytes // PREFILL_SHARE
    if context:
        budget = min(budget, max(plain_cache_bytes // CACHE_SHARE, CHUNK_FLOOR_BYTES))
    fits = max(1, budget // per_token)
    chunk = 1 << (fits.bit_length() - 1)
    return min(MAX_CHUNK, max(MIN_CHUNK, chunk))


def serve_prefill_chunk(per_token_bytes: int, free_bytes: int, on_cpu: bool) -> int:
    """Tokens per prefill forward of a server: prefill_chunk's, within SERVE_MAX_CHUNK."""
    most = SERVE_MAX_CHUNK["cpu" if on_cpu else "accelerator"]
    return min(most, prefill_chunk(per_token_bytes, free_bytes))


def decode_budget(free_bytes: int) -> int:
    """Bytes of plain K+V a decode group's caches may hold."""
    return free_bytes // DECODE_SHARE
