"""Loading a model spec (load_model); what validation knows without loading, and the specs
themselves, are in kvbench.models.info (no torch there).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kvbench.backends.torch_backend import DTYPES
from kvbench.models.attention import NAME as ATTENTION
from kvbench.models.bundled import prepared_dir
from kvbench.models.info import TINY_MAX_CONTEXT, describe_model, resolve_spec
from kvbench.models.layer_kinds import LayerKind, cached_widths, config_layer_kinds, with_sinks
from kvbench.models.tiny import build_tiny


@dataclass
class LoadedModel:
    spec: str
    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any  # .encode(text) -> list[int], .decode(ids) -> str
    num_layers: int
    num_kv_heads: int
    head_dim: int  # each cached key's width
    max_context: int | None
    dtype: torch.dtype
    layer_kinds: list[LayerKind]  # what each layer caches (kvbench.models.layer_kinds)
    value_dim: int  # each cached value's width: head_dim, except under MLA


def load_model(
    spec: str, device: torch.device | str = "cpu", log: Callable[[str], None] | None = None,
    dtype: str = "float32",
) -> LoadedModel:
    """Load the model a spec names, in eval mode, on `device`, its weights in `dtype`
    (float32, bfloat16 or float16)."""
    log = log or _stderr
    kind, target = resolve_spec(spec)
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
    torch_dtype = DTYPES[dtype]
    kinds = model_layer_kinds(model)
    kv_heads, head_dim, value_dim = cached_widths(
        kinds, getattr(config, "num_key_value_heads", None) or heads,
        getattr(config, "head_dim", None) or config.hidden_size // heads)
    return LoadedModel(
        spec=spec,
        model=model.to(device=device, dtype=torch_dtype),
        tokenizer=tokenizer,
        num_layers=config.num_hidden_layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_context=max_context,
        dtype=torch_dtype,
        layer_kinds=kinds,
        value_dim=value_dim,
    )


def model_layer_kinds(model) -> list[LayerKind]:
    """Each layer's kind: from the model's config, with what its attention modules hold (learned
    sink logits: gpt-oss's `sinks`)."""
    kinds = config_layer_kinds(model.config.to_dict())
    sinks = [False] * len(kinds)
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(getattr(module, "sinks", None), torch.nn.Parameter) and \
                type(index) is int and index < len(kinds):
            sinks[index] = True
    return with_sinks(kinds, sinks)


def meta_layer_kinds(spec: str) -> list[LayerKind]:
    """The layer kinds of the model a spec names, built on the meta device (no weights read,
    no memory): what its attention modules hold, for `kvbench models inspect`. Empty where the
    config cannot be built."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, target = resolve_spec(spec)
    if kind == "tiny":
        from kvbench.models.tiny import tiny_config

        config = tiny_config(target)
    else:
        if kind == "bundled":
            target = str(prepared_dir(target, _stderr))
        try:
            config = AutoConfig.from_pretrained(target, local_files_only=True)
        except (OSError, ValueError):
            return []
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model_layer_kinds(model)


def _load_transformers(folder: str):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its bar would tear kvbench's own progress display
    # kvbench's attention is SDPA unless a cache layer hands it a key bias or sparse-V; the
    # adapter relies on SDPA needing no mask for one-token steps.
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=ATTENTION, local_files_only=True
    )
    return model.eval(), _tokenizer(folder)


def load_tokenizer(spec: str, log: Callable[[str], None] | None = None) -> Any:
    """The tokenizer alone of the model a spec names (no weights): what a client of a server
    that has the model needs."""
    kind, target = resolve_spec(spec)
    if kind == "tiny":
        from kvbench.models.tiny import ByteTokenizer

        return ByteTokenizer()
    if kind == "bundled":
        target = str(prepared_dir(target, log or _stderr))
    return _tokenizer(target)


def _tokenizer(folder: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    # Whole texts are tokenized and then windowed: the "longer than max length" warning is noise.
    tokenizer.model_max_length = sys.maxsize
    return tokenizer


def _stderr(message: str) -> None:
    print(f"kvbench: {message}", file=sys.stderr)
