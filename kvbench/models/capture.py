"""Keys and values captured from a real model, for benchmarks that test codecs on real K/V."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from kvbench.models.loading import LoadedModel


@torch.no_grad()  # not inference_mode: callers may modify the returned tensors in place
def capture_kv(
    loaded: LoadedModel, token_ids: list[int], layers: list[int]
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Post-RoPE keys and values, each (1, kv_heads, T, head_dim) float32, from one prefill of
    `token_ids` through a plain DynamicCache."""
    bad = [i for i in layers if not 0 <= i < loaded.num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: {loaded.spec} has {loaded.num_layers} layers")
    if not token_ids:
        raise ValueError("capture_kv needs at least one token")
    device = next(loaded.model.parameters()).device
    cache = DynamicCache(config=loaded.model.config)
    input_ids = torch.tensor([token_ids], device=device)
    loaded.model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return {i: (cache.layers[i].keys.float(), cache.layers[i].values.float()) for i in layers}
