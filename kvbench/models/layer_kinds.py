"""What each layer of a model caches and how its attention reads it, from the model's config (no
torch; transformers' own reading of the config where transformers is installed), and which
methods can run on such a model.

A layer is one of:
  full      full causal attention over every token: the layers a method compresses
  sliding   attention over the last `window` tokens: hosted as transformers hosts it (its own
            window-bounded layer), so every method reads it as the model does
  linear    no per-token keys and values: linear attention or Mamba, a constant-size state
            kept in the library's own object
  hybrid    both in one layer (Falcon-H1): the attention is the method's, the state the
            library's (with a sliding window: the library's, both)
  none      caches nothing (a layer that shares another's cache, or has no attention)
  other     an attention kvbench does not host (indexed, compressed sparse): refused
and may have logit softcapping (Gemma 2), attention sinks (gpt-oss; known from the attention
module once loaded) or MLA (DeepSeek: transformers caches the latent, one "head" whose keys
are the compressed kv (kv_lora_rank wide) and whose values are the shared RoPE key part
(qk_rope_head_dim wide), and expands them into each head's keys and values after the cache).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

FULL, SLIDING, LINEAR, HYBRID, NONE, OTHER = "full", "sliding", "linear", "hybrid", "none", "other"
_MIXERS = {"full_attention": FULL, "sliding_attention": SLIDING, "chunked_attention": SLIDING,
           "conv": LINEAR, "linear_attention": LINEAR, "mamba": LINEAR, "hybrid": HYBRID,
           "hybrid_sliding": HYBRID, "dummy": NONE, "moe": NONE, "mlp": NONE,
           "attention": FULL}  # the last: layers_block_type's name (Jamba, before 5.3)


@dataclass(frozen=True)
class LayerKind:
    layer_type: str  # the library's name (config layer_types)
    mixer: str  # FULL, SLIDING, LINEAR, HYBRID, NONE or OTHER
    window: int | None = None  # sliding layers: tokens each query sees, itself included
    softcap: float | None = None  # tanh cap of the attention logits
    sinks: bool | None = None  # learned sink logits; None: unknown until the model is loaded
    key_dim: int | None = None  # MLA: the width of what the cache holds as keys (the latent)
    value_dim: int | None = None  # ... and as values (the RoPE part of the keys)

    @property
    def compressed(self) -> bool:
        """A method's policy hosts this layer's attention (every other kind is hosted by the
        library)."""
        return self.mixer == FULL or (self.mixer == HYBRID and self.window is None)

    @property
    def mla(self) -> bool:
        return self.key_dim is not None

    @property
    def fusable(self) -> bool:
        """The fused decode attention computes what the model does here: softmax, with the
        logits' softcap and the sinks where the model has them."""
        return self.compressed and not self.unfused_because()

    def unfused_because(self) -> str:
        """What of this layer's attention the fused kernels do not compute ("" if nothing):
        MLA's latent keys are not the keys attention scores."""
        return "MLA" if self.mla else ""

    def describe(self) -> str:
        text = {FULL: "full attention", SLIDING: f"sliding window of {self.window}",
                LINEAR: "linear attention / Mamba state",
                HYBRID: "attention + Mamba state" + (f", sliding window of {self.window}"
                                                     if self.window else ""),
                NONE: "no cache", OTHER: f"{self.layer_type} (not hosted)"}[self.mixer]
        extras = [f"softcap {self.softcap:g}"] if self.softcap else []
        extras += ["sinks"] if self.sinks else []
        extras += [f"MLA latent of {self.key_dim} + RoPE keys of {self.value_dim}"] \
            if self.mla else []
        return ", ".join([text, *extras])


def config_layer_kinds(config: dict[str, Any]) -> list[LayerKind]:
    """Every layer's kind from a config.json's mapping: transformers' own config class reads it
    where transformers is installed (it knows each family's defaults: Jamba's period, Falcon-H1's
    hybrid layers), else the mapping's own layer_types and sliding_window."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    types, windows = _library_layer_types(config)
    if types is None:
        count = text.get("num_hidden_layers")
        window = text.get("sliding_window")
        types = text.get("layer_types") or (
            ["sliding_attention" if window else "full_attention"] * count
            if type(count) is int else [])
        windows = [window if _MIXERS.get(t) == SLIDING else None for t in types]
    attention = {"softcap": text.get("attn_logit_softcapping") or None}
    if type(text.get("kv_lora_rank")) is int:  # MLA
        attention.update(key_dim=text["kv_lora_rank"], value_dim=text.get("qk_rope_head_dim"))
    kinds = []
    for layer_type, window in zip(types, windows):
        mixer = _MIXERS.get(layer_type, OTHER)
        kinds.append(LayerKind(layer_type, mixer,
                               window=window if mixer in (SLIDING, HYBRID) else None,
                               **(attention if mixer in (FULL, SLIDING, HYBRID) else {})))
    return kinds


def _library_layer_types(config: dict[str, Any]) -> tuple[list[str] | None, list]:
    """(layer types, sliding windows) as transformers reads the config, or (None, []) where it
    cannot (not installed, or a model type it does not know)."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return None, []
    try:
        text = AutoConfig.for_model(**config).get_text_config(decoder=True)
    except (ValueError, KeyError, TypeError):
        return None, []
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # transformers before 5.3: the config's own attribute
        types = getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None)
        if types is None:
            return None, []
        return list(types), [getattr(text, "sliding_window", None)] * len(types)
    types, kwargs = get_layer_types_and_kwargs(text)
    return list(types), [k.get("sliding_window") for k in kwargs]


def _transformers_hosts_states() -> bool:
    """Whether transformers' generic cache has linear-attention / Mamba layers (from 5.3; True
    where transformers is not installed: nothing to tell, the torch run refuses)."""
    try:
        import transformers.cache_utils as cache_utils
    except ImportError:
        return True
    return hasattr(cache_utils, "LinearAttentionCacheLayerMixin")


def with_sinks(kinds: list[LayerKind], sinks: list[bool]) -> list[LayerKind]:
    """The kinds with what the loaded model's attention modules say of sinks."""
    return [replace(kind, sinks=has) if kind.mixer in (FULL, SLIDING, HYBRID) else kind
            for kind, has in zip(kinds, sinks, strict=True)]


def cached_widths(kinds: list[LayerKind], kv_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(heads, key width, value width) of what each attention layer caches: the config's, except
    under MLA, where it is one latent "head" of key_dim and value_dim."""
    mla = next((kind for kind in kinds if kind.mla), None)
    return (1, mla.key_dim, mla.value_dim) if mla else (kv_heads, head_dim, head_dim)


def without_attention(kinds: list[LayerKind]) -> frozenset[int]:
    """The layers with no attention weights to measure (linear attention, Mamba, none)."""
    return frozenset(i for i, kind in enumerate(kinds) if kind.mixer in (LINEAR, NONE))


def every_layer_plain(kinds: list[LayerKind]) -> bool:
    """Every layer plain full attention, hosted by the method's policies, read by plain softmax
    (no kinds known: a plain model): what the batched step and the shared prefill serve."""
    return all(kind.mixer == FULL and kind.fusable for kind in kinds)


def layers_text(indices: list[int]) -> str:
    return ("layer " if len(indices) == 1 else "layers ") + ", ".join(map(str, indices))


def refusal(method: Any, kinds: list[LayerKind], backend: str = "torch") -> str | None:
    """Why `method` (a method's settings) cannot run on a model of these layers on `backend`,
    naming the layers; None where it runs (on the layers it compresses)."""
    if not kinds or method is None:
        return None
    other = [i for i, kind in enumerate(kinds) if kind.mixer == OTHER]
    if other:
        return (f"{layers_text(other)}: {kinds[other[0]].layer_type} attention is not hosted by"
                " kvbench")
    name = getattr(method, "name", "") or type(method).__name__
    stateful = [i for i, kind in enumerate(kinds) if kind.mixer in (LINEAR, HYBRID)]
    if stateful and backend == "torch" and not _transformers_hosts_states():
        return (f"{layers_text(stateful)}: {kinds[stateful[0]].describe()}; this transformers"
                " keeps such layers in a model-specific cache that kvbench does not host"
                " (transformers 5.3 or later keeps them in its generic cache layers)")
    compressed = [i for i, kind in enumerate(kinds) if kind.compressed]
    if getattr(method, "library_cache", False):
        plain = [i for i, kind in enumerate(kinds)
                 if not kind.compressed or kind.softcap or kind.sinks or kind.mla]
        if plain:
            return (f"{layers_text(plain)}: {kinds[plain[0]].describe()}; a library's own cache"
                    " or press is hosted on plain full-attention models only")
    if not compressed and name != "identity":
        mixers = sorted({kinds[i].describe() for i in range(len(kinds))})
        return (f"no layer to compress: every layer is {' or '.join(mixers)}, kept as the"
                " library keeps it, and methods compress full-attention layers only")
    mla = [i for i in compressed if kinds[i].mla]
    if mla and getattr(method, "scores_by_keys", False):
        return (f"{layers_text(mla)}: {kinds[mla[0]].describe()}; {name!r} scores tokens from the"
                " cached keys, and these layers cache the latent in their place")
    if mla and backend == "mlx" and getattr(method, "adds_keys", False):
        return (f"{layers_text(mla)}: {kinds[mla[0]].describe()}; mlx-lm's MLA masks the RoPE"
                f" scores itself before attention, which cannot take {name!r}'s added keys")
    return None
