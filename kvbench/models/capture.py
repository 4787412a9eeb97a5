"""What benchmarks measure inside a real model's attention: queries, keys and values captured for
the codec proofs, and attention entropy for methods that calibrate from it (adaptive)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.models.hf_cache import with_cache
from kvbench.models.loading import LoadedModel
from kvbench.models.own_cache import plain_cache

ROWS_PER_CHUNK = 256  # attention rows turned into entropies at a time: bounded float64 temporaries


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
    """One prefill of `token_ids` through the model's plain cache (own_cache.plain_cache); keys and values are what the cache
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
    cache = plain_cache(model)
    try:
        model(torch.tensor([token_ids], device=device), **with_cache(model, cache),
              use_cache=True, logits_to_keep=1)
    finally:
        for hook in hooks:
            hook.remove()
    return {
        i: Captured(queries[i].float(), cache.layers[i].keys.float(), cache.layers[i].values.float())
        for i in layers
    }


def entropy_sums(weights: torch.Tensor) -> torch.Tensor:
    """Per head, the summed entropy in bits of its attention rows: weights (heads, rows, keys),
    masked keys at weight 0; float64, ROWS_PER_CHUNK rows at a time."""
    total = torch.zeros(weights.shape[0], dtype=torch.float64, device=weights.device)
    for start in range(0, weights.shape[1], ROWS_PER_CHUNK):
        p = weights[:, start : start + ROWS_PER_CHUNK].double()
        total += -(p * torch.log2(p.clamp_min(1e-300))).sum(-1).sum(-1)
    return total


@torch.inference_mode()
def attention_entropy(model: Any, tokens: list[int],
                      without_attention: frozenset[int] = frozenset()) -> torch.Tensor:
    """Mean entropy, in bits, of each query head's attention rows over `tokens` (one causal
    forward pass of a transformers causal LM): float64 (layers, query heads), on the CPU; NaN
    rows for the layers `without_attention` (linear attention, Mamba), which have no weights.

    Attention weights come from transformers' eager attention: the model is switched to it for
    the pass and back to its own implementation afterwards (also on error). A forward hook on each
    attention module (a module with a layer_idx whose output is (output, weights)) reduces that
    layer's weights as soon as they exist, so only one layer's weights are held at a time.
    """
    entropies: dict[int, torch.Tensor] = {}

    def record(module, args, kwargs, output):
        if not (isinstance(output, tuple) and len(output) >= 2 and torch.is_tensor(output[1])
                and output[1].dim() == 4):
            return
        weights = output[1][0]  # (heads, queries, keys)
        # one module at several depths (Zamba 2's, layer_idx -1) is told its layer per call
        layer = module.layer_idx if module.layer_idx >= 0 else kwargs.get("layer_idx")
        if layer in without_attention:  # MiniMax's lightning attention returns its own weights
            return
        if layer in entropies:
            raise RuntimeError(f"attention of layer {layer} ran twice in one pass")
        entropies[layer] = (entropy_sums(weights) / weights.shape[1]).cpu()

    attention = [m for m in model.modules() if isinstance(getattr(m, "layer_idx", None), int)]
    device = next(model.parameters()).device
    ids = torch.tensor([list(tokens)], device=device)
    previous = model.config._attn_implementation
    handles = [m.register_forward_hook(record, with_kwargs=True) for m in attention]
    try:
        model.set_attn_implementation("eager")
        model(ids, use_cache=False, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
    layers = model.config.get_text_config().num_hidden_layers
    attending = [i for i in range(layers) if i not in without_attention]
    if sorted(entropies) != attending:
        raise RuntimeError(
            f"eager attention gave weights for layers {sorted(entropies)} of {layers};"
            " cannot measure attention entropy on this model"
        )
    heads = entropies[attending[0]].shape
    return torch.stack([entropies[i] if i in entropies
                        else torch.full(heads, float("nan"), dtype=torch.float64)
                        for i in range(layers)])
