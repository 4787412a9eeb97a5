"""Tiny random-weight models built in code (no files, no network) for fast tests.

`tiny:llama` and `tiny:qwen3`: 2 layers, hidden 64, 4 query heads, 2 KV heads of 16; the
architecture families (kvbench.models.tiny_configs): hidden 128, heads of 32. All have a
byte-level vocabulary of 260, and weights from a fixed seed, the same on every call.
"""
from __future__ import annotations

import torch

from kvbench.models.attention import NAME as ATTENTION
from kvbench.models.tiny_configs import TINY_CONFIGS

_SEED = 1234


class ByteTokenizer:
    """UTF-8 bytes shifted past 4 special ids (pad, bos, eos, unk)."""

    offset = 4
    vocab_size = 256 + offset
    eos_token_id = 2
    chat_template = None

    # The keywords are a transformers tokenizer's: there are no special tokens to add or skip.
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - self.offset for i in ids if i >= self.offset).decode("utf-8", "replace")


def tiny_config(kind: str, attn_implementation: str = ATTENTION):
    """The transformers config of a tiny kind, built by transformers' own config class."""
    from transformers import AutoConfig

    if kind not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny model {kind!r}; known: {', '.join(TINY_CONFIGS)}")
    config = AutoConfig.for_model(**TINY_CONFIGS[kind])
    config._attn_implementation = attn_implementation
    return config


def build_tiny(kind: str, attn_implementation: str = ATTENTION):
    """(model, tokenizer) for a tiny kind, float32, eval mode: a new model every call (a few
    ms), so that moving or changing one never reaches another caller's. attn_implementation:
    kvbench's attention, or the model's own ("eager": the reference every family is checked
    against)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(kind, attn_implementation)
    with torch.random.fork_rng():  # leave the caller's RNG stream untouched
        torch.manual_seed(_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval(), ByteTokenizer()
