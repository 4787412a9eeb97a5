"""Tiny random-weight models built in code (no files, no network) for fast tests.

`tiny:llama` and `tiny:qwen3`: 2 layers, hidden 64, 4 query heads, 2 KV heads of 16, a byte-level
vocabulary of 260. The weights come from a fixed seed, so they are the same on every call.
"""
from __future__ import annotations

import torch

from kvbench.models.attention import NAME as ATTENTION
from kvbench.models.info import TINY_HEAD_DIM, TINY_KINDS, TINY_MAX_CONTEXT

_SEED = 1234
_SHAPE = dict(
    vocab_size=260,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=TINY_HEAD_DIM,
    max_position_embeddings=TINY_MAX_CONTEXT,
    # Wider than the usual 0.02 so attention is peaked enough for cache errors to show in logits.
    initializer_range=0.2,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


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


def _config(kind: str):
    if kind == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**_SHAPE)
    if kind == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**_SHAPE)
    raise ValueError(f"unknown tiny model {kind!r}; known: {', '.join(TINY_KINDS)}")


def build_tiny(kind: str):
    """(model, tokenizer) for a tiny kind, float32, eval mode: a new model every call (a few
    ms), so that moving or changing one never reaches another caller's."""
    from transformers import AutoModelForCausalLM

    config = _config(kind)
    config._attn_implementation = ATTENTION
    with torch.random.fork_rng():  # leave the caller's RNG stream untouched
        torch.manual_seed(_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval(), ByteTokenizer()
