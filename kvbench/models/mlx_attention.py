"""kvbench's attention for mlx-lm models: mlx-lm's own scaled_dot_product_attention, unless the
kvbench cache layer it is handed holds a read plain attention cannot serve
(kvbench.models.host.AttentionRead: an additive bias, per key or per query and key, sparse-V, or
queries the policy observes).

Why this replaces a name in the model's module. mlx-lm has no attention registry (transformers
has AttentionInterface, which kvbench.models.attention uses). Each mlx-lm model file imports
`scaled_dot_product_attention` from mlx_lm.models.base and calls it as
`scaled_dot_product_attention(queries, keys, values, cache=cache, scale=..., mask=mask)`. The
mask cannot carry a per-layer bias: the model builds ONE mask from the first layer's cache and
gives it to every layer, while a compaction method's bias (like the keys it keeps) differs per
layer and head. The cache argument is the only per-layer path into attention, so install()
rebinds that name in the model's own module(s) to a wrapper that takes the read from the kvbench
cache layer it is given (kvbench.models.mlx_host.MLXPolicyLayer holds it in update_and_fetch,
as hf_cache.PolicyLayer does on torch). For every other call (mlx-
lm's KVCache, quantized caches, a kvbench layer with neither) the wrapper calls the original
function with the same arguments, so the identity method stays exactly mlx-lm's attention. The
rebinding covers every model of that architecture in the process; it is idempotent, and the
loader records which modules carry it (MLXLoaded.attention). A layer whose handoff is never read
(a model file that calls attention some other way) is refused at its next update, not ignored.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import mlx.core as mx

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.models.biased_attention import biased_attention as attention_on

ATTENTION_ATTR = "scaled_dot_product_attention"


def install(model: Any) -> tuple[str, ...]:
    """Rebind scaled_dot_product_attention to kvbench's in every module that defines `model`'s
    layers and imported it; returns those modules' names (empty: no bias / sparse-V possible)."""
    names = {type(model).__module__}
    names.update(type(module).__module__ for _, module in model.named_modules())
    installed = []
    for name in sorted(names):
        module = sys.modules.get(name)
        current = getattr(module, ATTENTION_ATTR, None)
        if not callable(current):
            continue
        if not hasattr(current, "__kvbench_original__"):
            setattr(module, ATTENTION_ATTR, _wrap(current))
        installed.append(name)
    return tuple(installed)


def _wrap(original: Callable) -> Callable:
    def scaled_dot_product_attention(queries, keys, values, *args, **kwargs):
        cache = kwargs.get("cache", args[0] if args else None)
        take = getattr(cache, "take_read", None)
        read = take() if take is not None else None
        if read is None:
            return original(queries, keys, values, *args, **kwargs)
        if kwargs.get("sinks") is not None:
            # the shared body takes sinks, but nothing checks it against mlx-lm's use of them
            raise NotImplementedError("kvbench's biased / sparse-V attention on MLX takes no"
                                      " attention sinks; this model uses them")
        scale = kwargs["scale"] if "scale" in kwargs else args[1]
        mask = kwargs["mask"] if "mask" in kwargs else args[2]
        sparse = None
        # sparse-V skips rows at one-query steps only: several queries are plain attention
        if read.bias is None and not (read.skip_below and queries.shape[-2] == 1):
            out = original(queries, keys, values, *args, **kwargs)
        else:
            out, sparse = biased_attention(queries, keys, values, mask, read.bias, scale,
                                           read.skip_below)
        read.attended(queries, sparse)
        return out

    scaled_dot_product_attention.__kvbench_original__ = original
    scaled_dot_product_attention.__doc__ = (
        f"kvbench's attention (kvbench.models.mlx_attention) around {original.__module__}."
        f"{original.__qualname__}")
    return scaled_dot_product_attention


def original_attention(module: Any) -> Callable:
    """The function install() wrapped in `module` (or what is there, if it wrapped nothing)."""
    current = getattr(module, ATTENTION_ATTR)
    return getattr(current, "__kvbench_original__", current)


def biased_attention(query: mx.array, key: mx.array, value: mx.array, mask: Any,
                     bias: mx.array | None, scale: float | None = None, skip_below: float = 0.0):
    """kvbench.models.biased_attention.biased_attention on mx.arrays, with mlx-lm's mask
    (None, "causal", a bool array or an additive one); no softcap or sinks (an mlx-lm model
    file that softcaps computes its attention itself; the wrapper refuses sinks)."""
    return attention_on(MLX_ARRAYS, query, key, value, mask, bias, scale, skip_below)
