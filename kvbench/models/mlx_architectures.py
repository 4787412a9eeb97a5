"""mlx-lm's architectures as kvbench hosts them: which of mlx-lm's model files runs a config, what
mlx-lm would miss in a transformers 5 config (and is given), the check that mlx-lm caches and
attends every layer as torch does (refused with the reason where it does not: a sliding window
or a logit softcap it ignores, MLA cached otherwise), each layer's kind as mlx-lm's own
make_cache() builds it, and the tiny families' torch weights in mlx-lm's names.

Refusals are ValueErrors raised at load, before any token runs: a model mlx-lm runs differently
from the torch model of the same config would otherwise give figures silently off (an MLX
Mistral with its window ignored was 58% off the torch one).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import mlx.core as mx

from kvbench.models.layer_kinds import (
    FULL,
    HYBRID,
    LINEAR,
    NONE,
    OTHER,
    SLIDING,
    LayerKind,
    layers_text,
)

# Model types a transformers 5 checkpoint may name that mlx-lm runs under another module's name
# (beyond mlx-lm's own MODEL_REMAPPING): the text-only configs of multimodal families.
_ALIASES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
# Config keys from which mlx-lm derives which layers are sliding / linear, periodically: the
# period is the position of the first full-attention layer, plus one.
_PERIODS = ("sliding_window_pattern", "full_attention_interval")
# Config features that change what attention computes; mlx-lm reads them from its ModelArgs.
_FEATURES = ("attn_logit_softcapping", "final_logit_softcapping")


def architecture(config: dict[str, Any]):
    """The mlx-lm module that runs `config` (mlx_lm.models.<name>); ValueError where mlx-lm has
    none."""
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = config.get("model_type")
    name = _ALIASES.get(model_type, MODEL_REMAPPING.get(model_type, model_type))
    try:
        return importlib.import_module(f"mlx_lm.models.{name}")
    except ImportError as exc:
        raise ValueError(f"mlx-lm has no {model_type} architecture (no mlx_lm.models.{name});"
                         " run this model on the torch backend") from exc


def described(config: dict[str, Any]) -> str:
    """`config`'s model type as mlx-lm runs it: 'mistral (mlx_lm.models.llama)'."""
    model_type = config.get("model_type")
    name = architecture(config).__name__.rpartition(".")[2]
    return model_type if name == model_type else f"{model_type} (mlx_lm.models.{name})"


def mlx_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """What mlx-lm would miss in `config` (a config.json's mapping, transformers 5 style) and
    must be given: RoPE settings only under rope_parameters (rope_overrides), the period of
    sliding / linear layers only as layer_types, and the model type of a text-only config. A
    config with a text_config gets them there."""
    fields = _all_fields(architecture(config))
    overrides = {}
    if config.get("model_type") in _ALIASES:
        overrides["model_type"] = _ALIASES[config["model_type"]]
    text = config.get("text_config")
    if isinstance(text, dict):
        inner = _text_overrides(text, fields)
        return {**overrides, "text_config": {**text, **inner}} if inner else overrides
    return {**_text_overrides(config, fields), **overrides}


def _text_overrides(config: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    overrides = rope_overrides(config)
    if "position_embedding_type" in fields and config.get("position_embedding_type") is None:
        # transformers rotates only under "rope" (Granite-MoE-Hybrid's default is None: no
        # RoPE); mlx-lm rotates unless told "nope"
        overrides["position_embedding_type"] = "nope"
    types = config.get("layer_types")
    if types and "full_attention" in types:
        period = types.index("full_attention") + 1
        periodic = all((t == "full_attention") == ((i + 1) % period == 0)
                       for i, t in enumerate(types))
        for key in _PERIODS:
            if key in fields and periodic and config.get(key) != period:
                overrides[key] = period
    return overrides


def rope_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """What mlx-lm would miss in a transformers 5 config: rope_theta (and a non-default scaling,
    and the partial rotary factor) nested under rope_parameters; per layer type (Gemma 3), the
    full layers' as rope_theta and the sliding layers' base as rope_local_base_freq. Without
    them mlx-lm silently uses its default RoPE."""
    params = config.get("rope_parameters") or {}
    overrides: dict[str, Any] = {}
    if isinstance(params.get("full_attention"), dict):  # per layer type (Gemma 3)
        sliding = params.get("sliding_attention") or {}
        params = params["full_attention"]
        if "rope_local_base_freq" not in config and "rope_theta" in sliding:
            overrides["rope_local_base_freq"] = sliding["rope_theta"]
    elif "partial_rotary_factor" not in config and "partial_rotary_factor" in params:
        overrides["partial_rotary_factor"] = params["partial_rotary_factor"]
    if "rope_theta" not in config and "rope_theta" in params:
        overrides["rope_theta"] = params["rope_theta"]
    if params.get("rope_type", "default") != "default" and not config.get("rope_scaling"):
        overrides["rope_scaling"] = dict(params)
    return overrides


def model_args(config: dict[str, Any]):
    """mlx-lm's ModelArgs of `config` (with mlx_overrides applied); ValueError naming the keys
    mlx-lm needs and the config lacks."""
    args_class = architecture(config).ModelArgs
    try:
        return args_class.from_dict(config)
    except TypeError as exc:
        required = [name for name, p in inspect.signature(args_class).parameters.items()
                    if p.default is inspect.Parameter.empty and name not in config]
        raise ValueError(f"mlx-lm's {described(config)} needs {', '.join(required) or 'keys'}"
                         f" in the config, which this config does not have ({exc})") from exc


def refuse_ignored_features(config: dict[str, Any]) -> None:
    """ValueError where `config` sets a feature that mlx-lm's model of its type does not read (a
    logit softcap, YaRN's untruncated correction range: gpt-oss), so would run without."""
    text = text_config(config)
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type")) == "yarn" and rope.get("truncate") is False:
        from mlx_lm.models.rope_utils import YarnRoPE

        if "truncate" not in inspect.signature(YarnRoPE).parameters:
            raise ValueError(
                f"mlx-lm's {described(config)} ignores the YaRN RoPE's truncate=False (its"
                " YarnRoPE always rounds the correction range); torch runs it, and the"
                " positions' rotations differ. Run this model on the torch backend")
    if "text_config" in config:
        return  # a wrapper: its text model's arguments are not its ModelArgs'
    fields = _fields(architecture(config).ModelArgs)
    for key in _FEATURES:
        if config.get(key) and key not in fields:
            raise ValueError(f"mlx-lm's {described(config)} ignores {key}={config[key]:g};"
                             " torch runs it. Run this model on the torch backend")


def mlx_layer_kind(cache: Any) -> LayerKind:
    """A layer's kind as mlx-lm's make_cache() entry for it says: its plain KVCache is full
    attention (the layers a method's policies host), a RotatingKVCache a sliding window of its
    size, an ArraysCache a linear-attention or Mamba state, a CacheList of both hybrid (with
    the window of a RotatingKVCache in it)."""
    from mlx_lm.models import cache as caches

    kind = type(cache)
    if kind in (caches.KVCache, caches.ConcatenateKVCache):
        return LayerKind("full_attention", FULL)
    if kind is caches.RotatingKVCache:
        return LayerKind("sliding_attention", SLIDING, window=cache.max_size)
    if kind is caches.ChunkedKVCache:
        return LayerKind("chunked_attention", SLIDING, window=cache.chunk_size)
    if isinstance(cache, caches.ArraysCache):
        return LayerKind("linear_attention", LINEAR)
    if isinstance(cache, caches.CacheList):
        inner = [mlx_layer_kind(c) for c in cache.caches]
        if all(kind.mixer == LINEAR for kind in inner):
            return LayerKind("mamba", LINEAR)
        window = next((kind.window for kind in inner if kind.mixer == SLIDING), None)
        return LayerKind("hybrid_sliding" if window else "hybrid", HYBRID, window=window)
    return LayerKind(kind.__name__, OTHER)


def library_caches(model: Any) -> list:
    """mlx-lm's own cache for every layer of `model`, as its generate builds them."""
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def check_layers(model: Any, config: dict[str, Any], kinds: list[LayerKind]) -> None:
    """ValueError where mlx-lm's model caches a layer other than the config says torch does
    (`kinds`: kvbench.models.layer_kinds.config_layer_kinds of the config): a sliding window it
    ignores (Mistral on mlx-lm's llama, Gemma 2), a linear layer it attends, a window of
    another size."""
    built = [mlx_layer_kind(cache) for cache in library_caches(model)]
    if not kinds:
        return
    name = described(config)
    if len(built) != len(kinds):
        raise ValueError(f"mlx-lm's {name} builds {len(built)} layers' caches, the config"
                         f" {len(kinds)} layers; run this model on the torch backend")
    ignored = [i for i, (want, got) in enumerate(zip(kinds, built))
               if want.mixer == SLIDING and got.mixer == FULL]
    if ignored:
        window = kinds[ignored[0]].window
        raise ValueError(
            f"mlx-lm's {name} ignores sliding_window={window}; torch runs it (at"
            f" {layers_text(ignored)} mlx-lm would attend every token, torch the last"
            f" {window}). Run this model on the torch backend")
    for i, (want, got) in enumerate(zip(kinds, built)):
        if want.mixer in (OTHER, NONE):
            continue  # refused per method (layer_kinds.refusal), or nothing to host
        if want.mixer != got.mixer or want.window != got.window:
            raise ValueError(
                f"layer {i}: the config makes it {want.describe()} (as torch runs it), mlx-lm's"
                f" {name} {got.describe()}; run this model on the torch backend")


def check_mla(model: Any, config: dict[str, Any], kinds: list[LayerKind]) -> None:
    """ValueError where an MLA model's mlx-lm file caches other than torch does: torch caches
    the latent, one "head" whose keys are the compressed kv (kv_lora_rank wide) and whose values
    the shared RoPE key part (kvbench.models.layer_kinds), as mlx-lm's deepseek_v3 does; an
    mlx-lm file that caches each head's expanded keys and values would have a method compress
    another tensor than on torch, against another plain size. One token through a cache that
    records what the model appends says which."""
    mla = next((kind for kind in kinds if kind.mla), None)
    if mla is None:
        return
    from mlx_lm.models.cache import KVCache

    class Probe(KVCache):
        shapes: tuple = ()

        def update_and_fetch(self, keys, values):
            self.shapes = (tuple(keys.shape), tuple(values.shape))
            return super().update_and_fetch(keys, values)

    probes = [Probe() if type(cache) is KVCache else cache for cache in library_caches(model)]
    mx.eval(model(mx.array([[0]]), cache=probes))
    keys, values = probes[kinds.index(mla)].shapes
    if (keys[1], keys[-1], values[1], values[-1]) != (1, mla.key_dim, 1, mla.value_dim):
        raise ValueError(
            f"mlx-lm's {described(config)} caches {keys[1]} heads' keys of {keys[-1]} and"
            f" {values[1]} heads' values of {values[-1]} per token, not MLA's latent of"
            f" {mla.key_dim} and RoPE keys of {mla.value_dim} as torch does: a method would"
            " compress another tensor than on torch. Run this model on the torch backend")


def mlx_sinks(model: Any) -> list[bool]:
    """Per layer, whether mlx-lm's model attends with learned sink logits (gpt-oss)."""
    return [any(isinstance(getattr(module, "sinks", None), mx.array)
                for module in layer.modules())
            for layer in model.layers]


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


# ---- the tiny families' torch weights -------------------------------------------------------

def torch_checkpoint_weights(torch_model: Any) -> dict[str, Any]:
    """The torch model's weights as its checkpoint stores them (transformers 5 fuses experts
    at load; save_pretrained writes them back per expert, as mlx-lm's sanitize expects); a
    tied weight once, under its first name, as save_pretrained writes it (a tied lm_head is the
    embeddings, which mlx-lm's Cohere 2 and LFM2 have no parameter for)."""
    state, stored = {}, set()
    for name, tensor in torch_model.state_dict().items():
        if tensor.data_ptr() not in stored:
            state[name] = tensor
            stored.add(tensor.data_ptr())
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the state dict is the checkpoint's
        return dict(state)
    return dict(revert_weight_conversion(torch_model, dict(state)))


def _gpt_oss_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """gpt-oss's float experts as transformers holds them (gate_up_proj (experts, hidden,
    2 * intermediate), gate and up interleaved; down_proj (experts, intermediate, hidden);
    x @ W) in mlx-lm's SwitchGLU names and layout (per expert (out, in)), which its sanitize
    only builds from the MXFP4 blocks."""
    out = {}
    for key, value in weights.items():
        if key.endswith("experts.gate_up_proj"):
            base = key.removesuffix("gate_up_proj")
            out[base + "gate_proj.weight"] = mx.contiguous(value[..., ::2].swapaxes(-1, -2))
            out[base + "up_proj.weight"] = mx.contiguous(value[..., 1::2].swapaxes(-1, -2))
        elif key.endswith("experts.gate_up_proj_bias"):
            base = key.removesuffix("gate_up_proj_bias")
            out[base + "gate_proj.bias"] = mx.contiguous(value[..., ::2])
            out[base + "up_proj.bias"] = mx.contiguous(value[..., 1::2])
        elif key.endswith("experts.down_proj"):
            out[key + ".weight"] = mx.contiguous(value.swapaxes(-1, -2))
        elif key.endswith("experts.down_proj_bias"):
            out[key.removesuffix("_bias") + ".bias"] = value
        else:
            out[key] = value
    return out


_FROM_TORCH = {"gpt_oss": _gpt_oss_experts}


def mlx_weights(model: Any, config: dict[str, Any], weights: dict[str, mx.array]):
    """The checkpoint's `weights` as `model` (mlx-lm's) loads them, after its sanitize;
    ValueError naming what does not map."""
    from mlx.utils import tree_flatten

    convert = _FROM_TORCH.get(config.get("model_type"))
    if convert is not None:
        weights = convert(weights)
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    wanted = dict(tree_flatten(model.parameters()))
    name = described(config)
    if any(k.endswith(".sinks") for k in weights) and not any(k.endswith(".sinks")
                                                             for k in wanted):
        raise ValueError(f"mlx-lm's {name} has no attention sinks; this model's attention has"
                         " them. Run it on the torch backend")
    extra, missing = sorted(set(weights) - set(wanted)), sorted(set(wanted) - set(weights))
    reshaped = [k for k in set(weights) & set(wanted) if weights[k].shape != wanted[k].shape]
    if extra or missing or reshaped:
        what = [f"{len(extra)} weights it has no parameter for ({', '.join(extra[:3])})"] \
            if extra else []
        what += [f"{len(missing)} parameters the weights lack ({', '.join(missing[:3])})"] \
            if missing else []
        what += [f"weights of another shape ({', '.join(sorted(reshaped)[:3])})"] \
            if reshaped else []
        raise ValueError(f"the weights do not map onto mlx-lm's {name}: {'; '.join(what)}")
    return list(weights.items())


def _all_fields(module: Any) -> set[str]:
    """The fields of every model-arguments class in an mlx-lm model module (a wrapper's and its
    text model's)."""
    from mlx_lm.models.base import BaseModelArgs

    return {name for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, BaseModelArgs)
            for name in _fields(value)}


def _fields(args_class: type) -> set[str]:
    if dataclasses.is_dataclass(args_class):
        return {f.name for f in dataclasses.fields(args_class)}
    return set(inspect.signature(args_class).parameters)
