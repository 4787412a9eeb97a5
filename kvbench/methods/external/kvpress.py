"""kvpress presses on torch (settings: kvbench.methods.settings.kvpress). The prompt's forward
runs as kvpress's own pipeline runs it (KVPressTextGenerationPipeline._forward: `with
press(model):` one forward over a fresh DynamicCache, the press compressing each layer's cache
after that layer's attention); the keys and values the press leaves then become the layers'
caches, which decoding reads and appends to."""
from __future__ import annotations

from typing import Any

import torch

from kvbench.methods.external.library_prefill import LibraryPrefill
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.kvpress import KVPress
from kvbench.methods.torch.token_cache import TokenCache


class PressedCache(TokenCache):
    """One layer's keys and values as the press left them; decoded tokens are appended after
    them, and positions go on from the prompt's length (seen_tokens)."""

    def hold(self, keys: torch.Tensor, values: torch.Tensor, seen: int) -> None:
        if keys.shape[-2] != values.shape[-2]:
            raise RuntimeError(f"the press left {keys.shape[-2]} keys and {values.shape[-2]}"
                               " values in one layer")
        self.keys, self.values, self._seen, self._fresh = keys, values, seen, 0


@implements(KVPress)
class TorchKVPress(LibraryPrefill):
    def __init__(self, settings: KVPress, on: Any):
        super().__init__(settings, on)
        self.press = settings.build_press()

    def new_layer_cache(self, layer_idx: int) -> PressedCache:
        return PressedCache()

    def prefill_forward(self, model, ids: torch.Tensor, policies: list, **kwargs) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache()
        with self.press(model):
            output = model(ids, past_key_values=cache, use_cache=True, **kwargs)
        if len(cache.layers) != len(policies):
            raise RuntimeError(f"the press's cache has {len(cache.layers)} layers, the model"
                               f" {len(policies)}")
        for policy, layer in zip(policies, cache.layers):
            # positions go on from the prompt's length, or from the kept count where the press
            # moved the kept keys to 0.. (the pipeline's context_length)
            seen = layer.keys.shape[-2] if self.settings.rerotates() else ids.shape[-1]
            policy.hold(layer.keys, layer.values, seen)
        return output
