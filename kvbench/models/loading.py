"""Model specs: what validation knows without loading (describe_model) and loading (load_model).

A spec is one of:
  bundled:NAME      the bundled checkpoint, prepared on first use (kvbench.models.bundled)
  tiny:llama|qwen3  tiny random-weight models for tests (kvbench.models.tiny)
  PATH              a local transformers checkpoint folder with a config.json
  ORG/NAME          a hub id, only if already in the local Hugging Face cache (no network at run)
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from kvbench.models.attention import NAME as ATTENTION
from kvbench.models.bundled import BUNDLED, bundled_model, prepared_dir
from kvbench.models.info import ModelInfo
from kvbench.models.tiny import TINY_KINDS, TINY_MAX_CONTEXT, build_tiny
from kvbench.registry import did_you_mean

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class LoadedModel:
    spec: str
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any  # .encode(text) -> list[int], .decode(ids) -> str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int | None
    dtype: torch.dtype


def describe_model(spec: str) -> ModelInfo:
    """What validation needs to know about `spec`, without loading it (ValueError if unusable)."""
    kind, target = _resolve(spec)
    if kind == "bundled":
        return ModelInfo(spec=spec, max_context=BUNDLED[target].max_context)
    if kind == "tiny":
        return ModelInfo(spec=spec, max_context=TINY_MAX_CONTEXT)
    config = json.loads(Path(target, "config.json").read_text())
    return ModelInfo(spec=spec, max_context=config.get("max_position_embeddings"))


def load_model(
    spec: str, device: torch.device | str = "cpu", log: Callable[[str], None] | None = None
) -> LoadedModel:
    """Load the model a spec names, float32 in eval mode, on `device`."""
    log = log or _stderr
    kind, target = _resolve(spec)
    if kind == "tiny":
        model, tokenizer = build_tiny(target)
        max_context = TINY_MAX_CONTEXT
    else:
        if kind == "bundled":
            target = str(prepared_dir(target, log))
        model, tokenizer = _load_transformers(target)
        max_context = describe_model(spec).max_context
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    return LoadedModel(
        spec=spec,
        model=model.to(device),
        tokenizer=tokenizer,
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        max_context=max_context,
        dtype=torch.float32,
    )


def _resolve(spec: str) -> tuple[str, str]:
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
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model path {str(path)!r} has no config.json (not a checkpoint folder)"
            )
        return "path", str(path)
    if _HUB_ID.match(spec):
        return "hub", _cached_hub_folder(spec)
    raise ValueError(f"model path {spec!r} does not exist")


def _cached_hub_folder(repo_id: str) -> str:
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        raise ValueError(
            f"model {repo_id!r} is not a local folder and not in the local Hugging Face cache;"
            " kvbench has no network at run time. Download it beforehand, or pass a local"
            " checkpoint path (or bundled:smollm2-135m)."
        )
    return str(Path(config).parent)


def _load_transformers(folder: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its bar would tear kvbench's own progress display
    # kvbench's attention is SDPA unless a cache layer hands it a key bias or sparse-V; the
    # adapter relies on SDPA needing no mask for one-token steps.
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=ATTENTION, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    # Whole texts are tokenized and then windowed: the "longer than max length" warning is noise.
    tokenizer.model_max_length = sys.maxsize
    return model.eval(), tokenizer


def _stderr(message: str) -> None:
    print(f"kvbench: {message}", file=sys.stderr)
