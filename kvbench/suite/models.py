"""The models a suite names: checkpoint paths resolved against the suite file, and each spec
described once (its limits, for the benchmarks' checks), with an issue wherever a bad one is
named."""
from __future__ import annotations

from pathlib import Path

from kvbench.models.info import ModelInfo, describe_model, expand_home
from kvbench.models.options import ChatOptions, LoadOptions
from kvbench.suite.errors import Issues, Placed
from kvbench.suite.schema import Defaults


def model_spec(model: Placed[str]) -> str:
    """A checkpoint path relative to the suite file becomes absolute; other specs stay."""
    spec = model.value
    if spec.startswith(("bundled:", "tiny:")):
        return spec
    path = expand_home(spec)
    if path.is_absolute():
        return str(path)
    local = Path(model.doc.file).parent / path
    if local.exists() or spec.startswith("."):
        return str(local.resolve())
    return spec  # a hub id such as HuggingFaceTB/SmolLM2-135M


class ModelDescriber:
    """describe_model once per spec, with the suite's max_context; each place that names a bad
    model (or one these defaults cannot load) gets the issue."""

    def __init__(self, issues: Issues, defaults: Defaults):
        self.issues, self.defaults = issues, defaults
        self.known: dict[str, tuple[ModelInfo | None, str]] = {}
        self.mlx_refusals: dict[str, str | None] = {}

    def __call__(self, model: Placed[str]) -> tuple[ModelInfo | None, bool]:
        spec = model_spec(model)
        if spec not in self.known:
            try:
                info = describe_model(spec).with_max_context(self.defaults.max_context)
                self.known[spec] = (info, loading_refusal(info, self.defaults) or "")
            except ValueError as exc:
                self.known[spec] = (None, str(exc))
        info, problem = self.known[spec]
        if problem:
            self.issues.add(model.doc, model.path, problem)
        return info, not problem

    def mlx_refusal(self, spec: str) -> str | None:
        """Why mlx-lm would run the model otherwise than torch (kvbench.models.mlx_loading), once
        per spec; None where mlx is not installed (the suite's own checks say so)."""
        if spec not in self.mlx_refusals:
            try:
                from kvbench.models.mlx_loading import mlx_refusal
            except ImportError:
                self.mlx_refusals[spec] = None
            else:
                self.mlx_refusals[spec] = mlx_refusal(spec)
        return self.mlx_refusals[spec]


def model_options(defaults: Defaults, info: ModelInfo | None) -> tuple[LoadOptions, ChatOptions]:
    """How the cases of the model `info` describes load it and put questions to it."""
    max_memory = defaults.max_memory and {str(k): v for k, v in defaults.max_memory.items()}
    return (LoadOptions(trust_remote_code=defaults.trust_remote_code,
                        device_map=defaults.device_map, max_memory=max_memory,
                        max_context=defaults.max_context,
                        checkpoint_dtype=info.dtype if info else None),
            ChatOptions(defaults.system_prompt, defaults.chat_template_kwargs))


def loading_refusal(info: ModelInfo, defaults: Defaults) -> str | None:
    """Why the suite's settings cannot load this checkpoint: weights quantized by mlx-lm on
    torch, or modelling code of its own that transformers lacks without trust_remote_code."""
    config = info.config
    # mlx-lm writes `quantization` (and a copy as quantization_config); transformers'
    # quantization_config names its quant_method
    if defaults.backend == "torch" and isinstance(config.get("quantization"), dict) \
            and "quant_method" not in (config.get("quantization_config") or {}):
        return (f"model {info.spec} is quantized by mlx-lm (config.json's quantization:"
                f" {config['quantization']}); transformers cannot load it: run it with"
                " backend: mlx, or name the checkpoint it was converted from")
    if "auto_map" in config and not defaults.trust_remote_code \
            and not _known_to_transformers(config.get("model_type")):
        return (f"model {info.spec} runs modelling code of its own (config.json's auto_map, model"
                f" type {config.get('model_type')!r}, which transformers does not know): set"
                " trust_remote_code: true if you trust that repository's code")
    return None


def _known_to_transformers(model_type) -> bool:
    """Whether transformers has its own class for the model type (True where transformers is
    not installed: the load says so then)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return True
    return model_type in CONFIG_MAPPING
