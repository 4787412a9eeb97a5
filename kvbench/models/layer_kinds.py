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
  none      caches nothing (no attention, or a layer that reads an earlier layer's cache:
            Gemma 3n's last layers reuse the K/V of the last earlier layer of their type, `reads`)
  other     an attention kvbench does not host (compressed sparse): refused
A full layer may be indexed (DeepSeek-V3.2's DSA, "indexed_attention": an indexer picks each
query's top `index_topk` past positions; kvbench.models.indexed_layer): only methods that keep
every token where it was (the quantizers) compose with it.
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
    reads: int | None = None  # a layer that caches nothing and attends over this layer's cache
    index_topk: int | None = None  # indexed attention: the keys its indexer selects per query

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
        MLA's latent keys are not the keys attention scores; an indexer's selection is a mask,
        which the fused one-token read does not take."""
        return " and ".join([*(["MLA"] if self.mla else []),
                             *(["the indexer's top-k mask"] if self.index_topk else [])])

    def describe(self) -> str:
        text = {FULL: "full attention" + (f", the indexer's top {self.index_topk} keys"
                                          if self.index_topk else ""),
                SLIDING: (f"attention in chunks of {self.window}"
                          if self.layer_type == "chunked_attention"
                          else f"sliding window of {self.window}"),
                LINEAR: "linear attention / Mamba state",
                HYBRID: "attention + Mamba state" + (f", sliding window of {self.window}"
                                                     if self.window else ""),
                NONE: "no cache" if self.reads is None else f"reads layer {self.reads}'s cache",
                OTHER: f"{self.layer_type} (not hosted)"}[self.mixer]
        extras = [f"softcap {self.softcap:g}"] if self.softcap else []
        extras += ["sinks"] if self.sinks else []
        extras += [f"MLA latent of {self.key_dim} + RoPE keys of {self.value_dim}"] \
            if self.mla else []
        return ", ".join([text, *extras])


class UnreadableConfig(ValueError):
    """transformers' own config class of the model's type raised on its config.json."""


def special_floats(mapping: dict[str, Any]) -> Any:
    """A json.loads object_hook: the floats JSON cannot hold, as transformers writes them into
    config.json ({"__float__": "Infinity"}, Mamba's time_step_limit), read back as floats."""
    if mapping.keys() == {"__float__"}:
        return float(mapping["__float__"])
    return mapping


def config_layer_kinds(config: dict[str, Any]) -> list[LayerKind]:
    """Every layer's kind from a config.json's mapping (read with special_floats): transformers'
    own config class reads it where transformers is installed and knows the model's type (it
    knows each family's defaults: Jamba's period, Falcon-H1's hybrid layers), else the
    mapping's own keys as that class reads them (_mapping_layer_types). UnreadableConfig where
    that class raises."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    types, windows, attention_types = _library_layer_types(config)
    if types is None:
        types, windows = _mapping_layer_types(text)
    attention = {"softcap": text.get("attn_logit_softcapping") or None}
    if type(text.get("kv_lora_rank")) is int:  # MLA
        attention.update(key_dim=text["kv_lora_rank"], value_dim=text.get("qk_rope_head_dim"))
    kinds = []
    for layer_type, window in zip(types, windows):
        mixer = _MIXERS.get(layer_type, OTHER)
        index = {}
        if layer_type == "indexed_attention" and type(text.get("index_topk")) is int:
            mixer, index = FULL, {"index_topk": text["index_topk"]}  # DSA: indexed_layer
        kinds.append(LayerKind(layer_type, mixer,
                               window=window if mixer in (SLIDING, HYBRID) else None,
                               **(attention if mixer in (FULL, SLIDING, HYBRID) else {}), **index))
    shared = text.get("num_kv_shared_layers")
    for reader, owner in _kv_readers(attention_types or text.get("layer_types") or [],
                                     shared if type(shared) is int else 0).items():
        kinds[reader] = LayerKind("dummy", NONE, reads=owner)
    return kinds


# model types whose layers transformers derives from the type itself, not from layer_types
_TYPE_LAYERS = {"mamba": "mamba", "mamba2": "mamba", "falcon_mamba": "mamba",
                "deepseek_v32": "indexed_attention", "falcon_h1": "hybrid"}
# Nemotron-H's hybrid_override_pattern, a character a layer
_PATTERN = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}


def _mapping_layer_types(text: dict[str, Any]) -> tuple[list[str], list]:
    """(layer types, windows) from a config's own mapping, without transformers: its
    layer_types, else what transformers derives (the model type's, Llama 4's chunks where
    no_rope_layers keeps RoPE, a sliding window on every layer)."""
    count, window = text.get("num_hidden_layers"), text.get("sliding_window")
    chunk = text.get("attention_chunk_size")
    period = text.get("attn_layer_period")
    if text.get("layer_types") or type(count) is not int:
        types = list(text.get("layer_types") or [])
    elif text.get("layers_block_type"):  # Zamba 2 (mamba, hybrid)
        types = list(text["layers_block_type"])
    elif isinstance(text.get("hybrid_override_pattern"), str):
        types = [_PATTERN.get(c, c) for c in text["hybrid_override_pattern"]]
    elif type(period) is int:  # Jamba: attention every period layers, from the offset
        types = ["attention" if i % period == text.get("attn_layer_offset", 0) else "mamba"
                 for i in range(count)]
    elif text.get("model_type") in _TYPE_LAYERS:
        types = [_TYPE_LAYERS[text["model_type"]]] * count
    elif type(chunk) is int:  # Llama 4: every fourth layer full, without RoPE, by default
        rope = text.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(count)]
        types = ["chunked_attention" if keeps else "full_attention" for keeps in rope]
    else:
        types = ["sliding_attention" if window else "full_attention"] * count
    return types, [chunk if t == "chunked_attention" else window if _MIXERS.get(t) == SLIDING
                   else None for t in types]


def _kv_readers(attention_types: list[str], shared: int) -> dict[int, int]:
    """{layer: the layer whose K/V it reuses}: the last `shared` layers each read the last
    earlier layer of their own type (transformers' kv_sharing_modes, Gemma 3n and 4)."""
    first = len(attention_types) - shared
    if shared <= 0 or first <= 0:
        return {}
    owners = {kind: i for i, kind in enumerate(attention_types[:first])}
    return {i: owners[kind] for i, kind in enumerate(attention_types) if i >= first
            and kind in owners}


def _library_layer_types(config: dict[str, Any]) -> tuple[list[str] | None, list, list | None]:
    """(cache layer types, sliding windows, attention layer types) as transformers reads the
    config, or (None, [], None) where it cannot (not installed, or a model type it does not
    know)."""
    try:
        import transformers
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None, [], None
    if config.get("model_type") not in CONFIG_MAPPING:
        return None, [], None
    try:  # as from_pretrained reads it; any error of the model's own class is the config's
        text = CONFIG_MAPPING[config["model_type"]].from_dict(config).get_text_config(
            decoder=True)
        return *_layer_types(text), getattr(text, "layer_types", None)
    except Exception as exc:  # noqa: BLE001 - whatever the class raises, said, not a traceback
        first = str(exc).strip().splitlines()[-1].strip() if str(exc).strip() else ""
        raise UnreadableConfig(
            f"transformers {transformers.__version__}'s {config['model_type']} config class"
            f" cannot read its config.json ({type(exc).__name__}: {first})") from None


def _layer_types(text: Any) -> tuple[list[str] | None, list]:
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
    """The layers with no attention weights to measure (linear attention, Mamba, none; a
    layer reading another's cache attends)."""
    return frozenset(i for i, kind in enumerate(kinds)
                     if kind.mixer in (LINEAR, NONE) and kind.reads is None)


def every_layer_plain(kinds: list[LayerKind]) -> bool:
    """Every layer plain full attention, hosted by the method's policies, read by plain softmax
    (no kinds known: a plain model): what the batched step and the shared prefill serve."""
    return all(kind.mixer == FULL and kind.fusable for kind in kinds)


def kept_windows(kinds: list[LayerKind]) -> dict[int, str]:
    """{layer: why a quantizer cannot hold it} for the windowed layers a method leaves to the
    library even when it holds windows (hosted_layers)."""
    read = {kind.reads: i for i, kind in enumerate(kinds) if kind.reads is not None}
    kept = {}
    for i, kind in enumerate(kinds):
        if kind.mixer == SLIDING and kind.layer_type == "chunked_attention":
            kept[i] = ("a query attends within its own chunk only, which a windowed cache's"
                       " one-token and fused reads (over every key it keeps) do not mask")
        elif kind.mixer == SLIDING and i in read:
            kept[i] = f"layer {read[i]} reads its cache"
        elif kind.mixer == HYBRID and kind.window:
            kept[i] = "its window and its Mamba state are the library's, both"
    return kept


def hosted_layers(method: Any, kinds: list[LayerKind]) -> list[int]:
    """The layers whose attention `method`'s policies hold (a method's settings or its
    implementation): the compressed ones (full attention), and the sliding-window ones where
    it holds windows (a quantizer's `layers`: kvbench.methods.core.window_cache), but those in
    kept_windows."""
    settings = getattr(method, "settings", method)
    windows = bool(getattr(settings, "holds_windows", lambda: False)())
    kept = kept_windows(kinds) if windows else {}
    return [i for i, kind in enumerate(kinds) if kind.compressed
            or (windows and kind.mixer == SLIDING and i not in kept)]


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
    readers = [i for i, kind in enumerate(kinds) if kind.reads is not None]
    if readers and backend == "mlx":
        return (f"{layers_text(readers)}: {kinds[readers[0]].describe()}; kvbench hands a"
                " layer another's cache on torch only")
    stateful = [i for i, kind in enumerate(kinds) if kind.mixer in (LINEAR, HYBRID)]
    if stateful and backend == "torch" and not _transformers_hosts_states():
        return (f"{layers_text(stateful)}: {kinds[stateful[0]].describe()}; this transformers"
                " keeps such layers in a model-specific cache that kvbench does not host"
                " (transformers 5.3 or later keeps them in its generic cache layers)")
    compressed = [i for i, kind in enumerate(kinds) if kind.compressed]
    hosted = hosted_layers(method, kinds)
    if getattr(method, "asks_every_layer", lambda: False)():
        windows = [i for i, kind in enumerate(kinds) if kind.window and i not in hosted]
        if windows:
            why = kept_windows(kinds).get(windows[0]) or (
                f"{name!r} keeps sliding-window layers to the library")
            return (f"{layers_text(windows)}: {kinds[windows[0]].describe()}; {why}, and"
                    " layers: all asks for every attention layer (layers: full, or unset,"
                    " leaves it to the library)")
    if getattr(method, "library_cache", False):
        plain = [i for i, kind in enumerate(kinds)
                 if not kind.compressed or kind.softcap or kind.sinks or kind.mla
                 or kind.index_topk]
        if plain:
            return (f"{layers_text(plain)}: {kinds[plain[0]].describe()}; a library's own cache"
                    " or press is hosted on plain full-attention models only")
    if not hosted and name != "identity":
        mixers = sorted({kinds[i].describe() for i in range(len(kinds))})
        return (f"no layer to compress: every layer is {' or '.join(mixers)}, kept as the"
                " library keeps it, and methods compress full-attention layers only (the"
                " quantizers sliding-window layers too, unless layers: full)")
    indexed = [i for i in compressed if kinds[i].index_topk]
    if indexed and backend == "mlx":
        return (f"{layers_text(indexed)}: {kinds[indexed[0]].describe()}; kvbench hosts an"
                " indexer's key cache beside a method's policy on torch only")
    moved = keys_moved_by(method) if indexed else ""
    if moved:
        return (f"{layers_text(indexed)}: {kinds[indexed[0]].describe()}; the indexer selects"
                f" among every past position, and {name!r} {moved}, so the selection would not"
                " index the keys its cache holds")
    mla = [i for i in compressed if kinds[i].mla]
    if mla and getattr(method, "scores_by_keys", False):
        return (f"{layers_text(mla)}: {kinds[mla[0]].describe()}; {name!r} scores tokens from the"
                " cached keys, and these layers cache the latent in their place")
    if mla and backend == "mlx" and getattr(method, "adds_keys", False):
        return (f"{layers_text(mla)}: {kinds[mla[0]].describe()}; mlx-lm's MLA masks the RoPE"
                f" scores itself before attention, which cannot take {name!r}'s added keys")
    return None


def keys_moved_by(method: Any) -> str:
    """How `method` (a method's settings) changes which keys a layer holds, or where ("" where
    it keeps every token where it was, as the quantizers do): a token method evicts or compacts,
    a structured sparse one adds block summaries, decay evicts its oldest segments; a wrapper
    (sparse_v) as its base."""
    from kvbench.methods.settings.tokens import TokenMethod

    base = getattr(method, "base_settings", None)
    if base is not None and keys_moved_by(base):
        return keys_moved_by(base)
    if isinstance(method, TokenMethod):
        return f"keeps only {method.describe()}"
    if getattr(method, "adds_keys", False):
        return "adds block summaries to the keys"
    if getattr(method, "evict_below", 0):
        return f"evicts the segments scored below {method.evict_below:g}"
    return ""
