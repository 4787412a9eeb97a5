"""Models whose modeling code keeps their cache in a class of their own, whose forward takes no
other (MiniMax's MiniMaxCache, which holds its lightning-attention states in a list beside the
attention layers): kvbench's cache is then also an instance of that class, so the model keeps
its own state as it does without kvbench while the method's policies hold the attention
layers. A class kvbench does not know (HOSTED) is refused at validate, with the reason.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache

from kvbench.models.hf_cache import KVBenchCache, tensor_bytes


@functools.cache
def own_cache_class(model_class: type) -> type | None:
    """The Cache subclass the model's modeling module defines for itself, or None (the model
    takes transformers' generic cache)."""
    module = sys.modules[model_class.__module__]
    own = [value for value in vars(module).values()
           if isinstance(value, type) and issubclass(value, Cache)
           and value.__module__ == module.__name__]
    return own[0] if own else None


class MiniMaxStates:
    """What MiniMaxCache keeps beside its layers: each lightning-attention layer's state, in
    `linear_cache`. Its own get_linear_cache tells a layer's first step from the cache's length,
    which its layers, built as they are first updated, keep short; kvbench's cache holds every
    layer from the start, so a state is none until the layer has kept one."""

    linear_cache: list

    def get_linear_cache(self, layer_idx: int):
        held = self.linear_cache[layer_idx] if layer_idx < len(self.linear_cache) else None
        return held if isinstance(held, torch.Tensor) else None


class CountedMiniMax:
    """MiniMaxCache as the plain reference: its own count of tokens seen is its first layer's,
    a linear layer's, whose layer object counts nothing (so its own decode restarts positions
    at 0; transformers 5.25); here the most any layer has seen."""

    layers: list

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max((layer.get_seq_length() for layer in self.layers), default=0)


# the models' own cache classes kvbench stands in for: (what each keeps beside its layers,
# under kvbench's cache; what its plain reference needs of it)
HOSTED = {"MiniMaxCache": (MiniMaxStates, CountedMiniMax)}


def own_cache_refusal(model_type: str) -> str | None:
    """Why no method can run on a model of this type, from its cache class (None: none of its
    own, or one kvbench hosts); read from the classes transformers registers for it."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[model_type]]
    except (KeyError, ValueError):
        return None
    return unhosted_because(model_class)


def unhosted_because(model_class: type) -> str | None:
    """Why kvbench cannot stand in for the model class's own cache class (None: it has none,
    or kvbench hosts it)."""
    own = own_cache_class(model_class)
    if own is None or own.__name__ in HOSTED:
        return None
    return (f"{model_class.__name__} keeps its cache in a class of its own, {own.__name__}, which"
            f" kvbench does not host beside its policies (it hosts {', '.join(HOSTED)})")


@functools.cache
def _hosting_class(own: type) -> type:
    class OwnCacheHost(HOSTED[own.__name__][0], KVBenchCache, own):
        """KVBenchCache that is also the model's own cache class: what that class keeps beside
        the layers (the attributes its constructor sets), the model keeps here as in its own."""

        def __init__(self, *args, **kwargs):
            KVBenchCache.__init__(self, *args, **kwargs)
            fresh = vars(own())
            self.own_state = [name for name in fresh if name not in vars(self)]
            for name in self.own_state:
                setattr(self, name, fresh[name])

        def library_bytes(self) -> int:
            """And the tensors of the model's own state (MiniMax's lightning-attention
            states)."""
            return super().library_bytes() + sum(tensor_bytes(getattr(self, name))
                                                 for name in self.own_state)

    OwnCacheHost.__name__ = OwnCacheHost.__qualname__ = f"KVBench{own.__name__}"
    return OwnCacheHost


def kvbench_cache(model: Any, *args, **kwargs) -> KVBenchCache:
    """KVBenchCache(*args, **kwargs) for `model`, an instance of the model's own cache class
    where it has one."""
    own = own_cache_class(type(model))
    if own is None:
        return KVBenchCache(*args, **kwargs)
    why = unhosted_because(type(model))
    if why:  # validation refuses it (own_cache_refusal); a model loaded by hand reaches here
        raise ValueError(why)
    return _hosting_class(own)(*args, **kwargs)


def plain_cache(model: Any) -> Cache:
    """The cache the model builds for itself without kvbench: transformers' generic one from its
    config, or the model's own class (counting the tokens it has seen, CountedMiniMax)."""
    own = own_cache_class(type(model))
    if own is None:
        return DynamicCache(config=model.config)
    if own.__name__ not in HOSTED:
        raise ValueError(unhosted_because(type(model)))
    return _counted_class(own)()


@functools.cache
def _counted_class(own: type) -> type:
    return type(own.__name__, (HOSTED[own.__name__][1], own), {})
