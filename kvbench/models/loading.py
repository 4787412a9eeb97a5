"""Loading a model spec (load_model); what validation knows without loading, and the specs
themselves, are in kvbench.models.info (no torch there).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kvbench.backends.torch_backend import DTYPES
from kvbench.hub import DownloadProgress
from kvbench.models.attention import NAME as ATTENTION
from kvbench.models.bundled import prepared_dir
from kvbench.models.chat import stop_ids
from kvbench.models.info import (
    checkpoint_folder, describe_model, generation_stop_ids, resolve_spec,
)
from kvbench.models.options import AUTO, LoadOptions, resolved_dtype
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
    # the model's generation_config.json: the ids that end an answer, beside the tokenizer's
    # eos (Llama 3's <|eot_id|>, Gemma's <end_of_turn>)
    stop_ids: tuple[int, ...] = ()
    # what computes the prompt's attention (SDPA's backends differ in rounding), for info.impl
    prefill_attention: str = ""


def load_model(
    spec: str, device: torch.device | str = "cpu", log: Callable[[str], None] | None = None,
    dtype: str = AUTO, revision: str | None = None, options: LoadOptions = LoadOptions(),
    progress: DownloadProgress | None = None,
) -> LoadedModel:
    """Load the model a spec names, in eval mode, on `device` (or placed by options.device_map),
    its weights loaded in `dtype` (float32, bfloat16, float16, or auto: models.options); a hub
    model at `revision` (a commit; None: what its spec names now), downloaded on first use, its
    progress told to `progress` (default: `log`, every 10 s)."""
    log = log or _stderr
    progress = progress or DownloadProgress(log, log, every_s=10)
    device = torch.device(device)
    kind, target = resolve_spec(spec)
    info = describe_model(spec, revision).with_max_context(options.max_context)
    torch_dtype = DTYPES[resolved_dtype(dtype, device.type, info.dtype)]
    if kind == "tiny":
        model, tokenizer = build_tiny(target)
        model = model.to(device=device, dtype=torch_dtype)
        generation_ids: tuple[int, ...] = ()
    else:
        if kind == "bundled":
            target = str(prepared_dir(target, log))
        else:
            target = checkpoint_folder(spec, info.revision, code=options.trust_remote_code,
                                       progress=progress)
        model = _load_transformers(target, torch_dtype, device, options)
        tokenizer = _tokenizer(target, options.trust_remote_code)
        generation_ids = generation_stop_ids(target)
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kinds = model_layer_kinds(model)
    kv_heads, head_dim, value_dim = cached_widths(
        kinds, getattr(config, "num_key_value_heads", None) or heads,
        getattr(config, "head_dim", None) or config.hidden_size // heads)
    return LoadedModel(
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        num_layers=config.num_hidden_layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_context=info.max_context,
        dtype=torch_dtype,
        layer_kinds=kinds,
        value_dim=value_dim,
        stop_ids=generation_ids,
        prefill_attention=prefill_attention(device),
    )


def prefill_attention(device: torch.device) -> str:
    """What computes a prompt's attention: kvbench's attention over torch's SDPA, with the SDPA
    backends torch may pick from on this device."""
    if device.type != "cuda":
        return f"kvbench attention over torch SDPA ({device.type})"
    enabled = [name for name, on in (
        ("flash", torch.backends.cuda.flash_sdp_enabled()),
        ("cudnn", torch.backends.cuda.cudnn_sdp_enabled()),
        ("mem_efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
        ("math", torch.backends.cuda.math_sdp_enabled())) if on]
    return f"kvbench attention over torch SDPA (cuda: {', '.join(enabled)} enabled)"


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
        else:
            target = checkpoint_folder(spec, weights=False)
        try:
            config = AutoConfig.from_pretrained(target, local_files_only=True)
        except (OSError, ValueError):
            return []
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model_layer_kinds(model)


def _load_transformers(folder: str, dtype: torch.dtype, device: torch.device,
                       options: LoadOptions):
    """The checkpoint's weights loaded straight into `dtype` (never float32 first: an 8B model
    in bf16 needs 16 GB, not 32), onto `device` or where options.device_map places them."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its bar would tear kvbench's own progress display
    placement = {}
    if options.device_map is not None:
        placement["device_map"] = options.device_map
        if options.max_memory:
            placement["max_memory"] = {int(key) if key.isdigit() else key: value
                                       for key, value in options.max_memory.items()}
    elif device.type != "cpu":
        placement["device_map"] = {"": device}  # loaded on the device, not through host memory
    # kvbench's attention is SDPA unless a cache layer hands it a key bias or sparse-V; the
    # adapter relies on SDPA needing no mask for one-token steps.
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation=ATTENTION, local_files_only=True,
        trust_remote_code=options.trust_remote_code, **placement)
    return model.eval()


def load_tokenizer(spec: str, log: Callable[[str], None] | None = None,
                   revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The tokenizer alone of the model a spec names (no weights read or downloaded)."""
    return load_client_tokenizer(spec, log, revision, trust_remote_code)[0]


def load_client_tokenizer(spec: str, log: Callable[[str], None] | None = None,
                          revision: str | None = None, trust_remote_code: bool = False,
                          ) -> tuple[Any, frozenset[int]]:
    """What a client of a server that has the model needs: its tokenizer (no weights read or
    downloaded; a hub model's at `revision`, a commit) and every id that ends an answer (the
    tokenizer's eos and its generation_config.json's, where a server stops)."""
    kind, target = resolve_spec(spec)
    if kind == "tiny":
        from kvbench.models.tiny import ByteTokenizer

        return ByteTokenizer(), stop_ids(ByteTokenizer(), ())
    if kind == "bundled":
        target = str(prepared_dir(target, log or _stderr))
    else:
        target = checkpoint_folder(spec, revision, weights=False, code=trust_remote_code)
    tokenizer = _tokenizer(target, trust_remote_code)
    return tokenizer, stop_ids(tokenizer, generation_stop_ids(target))


def _tokenizer(folder: str, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                              trust_remote_code=trust_remote_code)
    # Whole texts are tokenized and then windowed: the "longer than max length" warning is noise.
    tokenizer.model_max_length = sys.maxsize
    return tokenizer


def _stderr(message: str) -> None:
    print(f"kvbench: {message}", file=sys.stderr)
