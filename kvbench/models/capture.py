"""Queries, keys and values captured from a real model, for benchmarks that test codecs on them."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvbench.models.loading import LoadedModel


@dataclass
class Captured:
    """One layer's post-RoPE tensors, float32: queries (1, heads, T, D), keys and values
    (1, kv_heads, T, D). Query head h attends with key head h // (heads // kv_heads)."""

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor


def _post_rope_queries(attention, hidden_states, position_embeddings) -> torch.Tensor:
    """The queries `attention` computes, as its own forward does (q_norm where the model has it),
    with the rotary function of the model's own module."""
    shape = (*hidden_states.shape[:-1], -1, attention.head_dim)
    queries = attention.q_proj(hidden_states).view(shape)
    if hasattr(attention, "q_norm"):
        queries = attention.q_norm(queries)
    queries = queries.transpose(1, 2)
    rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb
    cos, sin = position_embeddings
    return rotate(queries, queries, cos, sin)[0]


@torch.no_grad()  # not inference_mode: callers may modify the returned tensors in place
def capture_qkv(loaded: LoadedModel, token_ids: list[int], layers: list[int]) -> dict[int, Captured]:
    """One prefill of `token_ids` through a plain DynamicCache; keys and values are what the cache
    holds, queries are recomputed from each attention layer's inputs by a forward pre-hook."""
    bad = [i for i in layers if not 0 <= i < loaded.num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: {loaded.spec} has {loaded.num_layers} layers")
    if not token_ids:
        raise ValueError("capturing needs at least one token")
    model = loaded.model
    queries: dict[int, torch.Tensor] = {}
    hooks = []
    for i in layers:
        attention = model.model.layers[i].self_attn

        def keep_queries(module, args, kwargs, i=i):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            queries[i] = _post_rope_queries(module, hidden, kwargs["position_embeddings"])

        hooks.append(attention.register_forward_pre_hook(keep_queries, with_kwargs=True))
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    try:
        model(torch.tensor([token_ids], device=device), past_key_values=cache, use_cache=True,
              logits_to_keep=1)
    finally:
        for hook in hooks:
            hook.remove()
    return {
        i: Captured(queries[i].float(), cache.layers[i].keys.float(), cache.layers[i].values.float())
        for i in layers
    }
