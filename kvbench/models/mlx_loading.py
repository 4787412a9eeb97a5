"""mlx-lm models as kvbench loads them: MLXLoaded, load_mlx_model, and mlx_refusal.

Specs are those of kvbench.models.loading: bundled:NAME (prepared on first use), a local
checkpoint folder, a hub id already in the local cache, and tiny:KIND (the torch tiny model's
weights copied into the mlx-lm architecture of its model type, so tests can compare the
backends). A model mlx-lm would run otherwise than torch (a sliding window or a softcap it
ignores, MLA cached otherwise; kvbench.models.mlx_architectures) is refused at load.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from kvbench.hub import DownloadProgress
from kvbench.models.layer_kinds import (LayerKind, cached_widths, config_layer_kinds,
                                         special_floats, with_sinks)
from kvbench.models.mlx_architectures import (
    architecture,
    check_layers,
    check_mla,
    mlx_overrides,
    mlx_sinks,
    mlx_weights,
    model_args,
    refuse_ignored_features,
    rope_overrides,
    text_config,
    torch_checkpoint_weights,
)
from kvbench.models.mlx_attention import install


@dataclass
class MLXLoaded:
    spec: str
    model: Any  # an mlx-lm model (mlx.nn.Module), weights as the checkpoint stores them
    tokenizer: Any  # the checkpoint's transformers tokenizer: the same ids as the torch loader
    num_layers: int
    num_kv_heads: int
    head_dim: int  # each cached key's width
    max_context: int | None
    # Modules whose scaled_dot_product_attention is kvbench's (empty: bias / sparse-V refused).
    attention: tuple[str, ...] = ()
    layer_kinds: list = dataclasses.field(default_factory=list)  # kvbench.models.layer_kinds
    value_dim: int | None = None  # each cached value's width (None: head_dim; MLA's differs)
    stop_ids: tuple[int, ...] = ()  # generation_config.json's ids that end an answer
    prefill_attention: str = "kvbench attention over MLX's scaled_dot_product_attention"


def load_mlx_model(spec: str, log: Callable[[str], None] | None = None,
                   revision: str | None = None, max_context: int | None = None,
                   progress: DownloadProgress | None = None) -> MLXLoaded:
    """The mlx-lm model a spec names (see kvbench.models.loading; a hub model at `revision`, a
    commit, downloaded on first use, its progress told to `progress`), loaded anew: the runner
    shares one per run between its cases. max_context: the suite's, in place of the config's."""
    from kvbench.models.bundled import prepared_dir
    from kvbench.models.info import (
        checkpoint_folder, describe_model, generation_stop_ids, resolve_spec,
    )

    log = log or _stderr
    kind, target = resolve_spec(spec)
    info = describe_model(spec, revision).with_max_context(max_context)
    stop_ids: tuple[int, ...] = ()
    if kind == "tiny":
        model, tokenizer, config, kinds = _build_tiny(target)
    else:
        if kind == "bundled":
            target = str(prepared_dir(target, log))
        else:
            target = checkpoint_folder(spec, info.revision,
                                       progress=progress or DownloadProgress(log, log, 10))
        model, tokenizer, config, kinds = _load_folder(Path(target), log)
        stop_ids = generation_stop_ids(target)
    attention = install(model)
    kv_heads, head_dim = _dimensions(model, config)
    check_mla(model, config, kinds)
    sinks = mlx_sinks(model)
    if len(sinks) == len(kinds):
        kinds = with_sinks(kinds, sinks)
    kv_heads, head_dim, value_dim = cached_widths(kinds, kv_heads, head_dim)
    return MLXLoaded(
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        num_layers=len(model.layers),
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_context=info.max_context,
        attention=attention,
        layer_kinds=kinds,
        value_dim=value_dim,
        stop_ids=stop_ids,
    )


def _dimensions(model, config: dict) -> tuple[int, int]:
    """(KV heads, head width) from the config mlx-lm was given, else its model arguments."""
    text = text_config(config)
    args = getattr(model, "args", None)

    def setting(name):
        return text.get(name) or getattr(args, name, None)

    heads = setting("num_attention_heads")
    return (setting("num_key_value_heads") or heads,
            setting("head_dim") or setting("hidden_size") // heads)


def _checked_architecture(config: dict, kinds: list[LayerKind]):
    """mlx-lm's model of `config` (weights not loaded), refused where it would run otherwise
    than torch (kvbench.models.mlx_architectures)."""
    refuse_ignored_features(config)
    model = architecture(config).Model(model_args(config))
    check_layers(model, config, kinds)
    return model


def _load_folder(folder: Path, log: Callable[[str], None]):
    from mlx_lm.utils import load_model
    from transformers import AutoTokenizer

    config = json.loads((folder / "config.json").read_text(), object_hook=special_floats)
    overrides = mlx_overrides(config)
    rope = [key for key in overrides if key in rope_overrides(config)]
    if rope:
        log(f"{folder}: config.json has {', '.join(rope)} only under rope_parameters"
            " (transformers 5); passing it to mlx-lm, which reads the top-level key only")
    derived = {key: value for key, value in overrides.items() if key not in rope}
    if derived:
        log(f"{folder}: passing mlx-lm {derived}, which config.json says only as"
            " layer_types / a text-only model type")
    kinds = config_layer_kinds(config)
    config = {**config, **overrides}
    _checked_architecture(config, kinds)
    model, _ = load_model(folder, model_config=overrides)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.model_max_length = sys.maxsize  # as the torch loader: whole texts, then windows
    return model, tokenizer, config, kinds


def mlx_refusal(spec: str) -> str | None:
    """Why mlx-lm would run the model a spec names otherwise than torch does (the checks made
    when it is loaded, on its config and mlx-lm's model built without weights: mlx arrays are
    lazy, so nothing is computed or held), or None: what validation refuses on backend mlx."""
    from transformers import AutoConfig

    from kvbench.models.info import describe_model, resolve_spec
    from kvbench.models.tiny_configs import TINY_CONFIGS

    kind, target = resolve_spec(spec)
    if kind == "bundled":
        return None  # a Llama, as mlx-lm runs it
    if kind == "tiny":
        written = TINY_CONFIGS[target]
        config = {**AutoConfig.for_model(**written).to_dict(), **written}
    else:
        config = written = describe_model(spec).config
    try:
        _checked_architecture({**config, **mlx_overrides(config)}, config_layer_kinds(written))
    except ValueError as exc:
        return str(exc)
    return None


def _build_tiny(kind: str):
    """The torch tiny model's config and weights in the mlx-lm architecture of its model type:
    (model, tokenizer, the config mlx-lm was given, the layers' kinds). The config is the
    family's as its checkpoints write it (kvbench.models.tiny_configs), transformers' defaults
    filled in; the weights as the torch model's checkpoint stores them."""
    from kvbench.models.tiny import build_tiny
    from kvbench.models.tiny_configs import TINY_CONFIGS

    torch_model, tokenizer = build_tiny(kind)
    written = TINY_CONFIGS[kind]
    config = {**torch_model.config.to_dict(), **written}
    config.update(mlx_overrides(config))
    kinds = config_layer_kinds(written)
    model = _checked_architecture(config, kinds)
    weights = {name: mx.array(np.ascontiguousarray(
                   (t.detach().float() if t.is_floating_point() else t.detach()).numpy()))
               for name, t in torch_checkpoint_weights(torch_model).items()}
    model.load_weights(mlx_weights(model, config, weights), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model, tokenizer, config, kinds


def _stderr(message: str) -> None:
    print(f"kvbench: {message}", file=sys.stderr)
