"""`mlx-lm-quantized` and `mlx-lm-rotating`: mlx-lm's own KV caches (QuantizedKVCache,
RotatingKVCache), run unchanged on the MLX backend (kvbench.methods.external.mlx_lm_cache runs
them)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, at_least, one_of, param
from kvbench.methods.settings.base import (
    Capabilities, MethodSettings, PrefillReads, register_method,
)

# What mx.quantize's affine mode takes (mlx's table of quantization modes)
BITS = (1, 2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


@dataclass
class MLXLMCache(MethodSettings):
    """One of mlx-lm's cache classes per model layer, built with these arguments: every step's
    keys and values go to its update_and_fetch, and mlx-lm's own attention reads what that
    returns, with the cache's own mask, as in mlx-lm's generate_step(prompt_cache=...)."""

    implemented_in: ClassVar[dict[str, str]] = {"mlx": "kvbench.methods.external.mlx_lm_cache"}
    library_cache: ClassVar[bool] = True
    extra: ClassVar[str | None] = "mlx"
    # its caches hold mx.arrays, on no torch device: it runs on the mlx backend only (its one
    # implementation is registered for MLX)
    capabilities: ClassVar[Capabilities] = Capabilities(devices=())

    prefill_reads: PrefillReads = param(
        "stored", kw_only=True, meaning="stored: attention reads what the cache's update_and_fetch"
        " returns, the step's own tokens included (the only reading mlx-lm's caches have)")

    # the mlx-lm class it runs and what that holds, for its layout
    cache_class: ClassVar[str]
    holds: ClassVar[str]

    def layout(self) -> str:
        return f"mlx-lm {self.cache_class}, {self.describe()}: {self.holds}; K and V both counted"

    def check(self) -> None:
        if self.prefill_reads != "stored":
            raise SettingError("prefill_reads", f"{self.name} reads what mlx-lm's cache returns:"
                                                " prefill_reads must be stored")


@register_method("mlx-lm-quantized")
@dataclass
class MLXLMQuantized(MLXLMCache):
    """mlx-lm's QuantizedKVCache: keys and values quantized from the first token on, per group
    of `group_size` channels at `bits` bits (mx.quantize, affine: a scale and a bias per group,
    at the model's dtype); attention runs on the codes, as mlx-lm's
    quantized_scaled_dot_product_attention does (mx.quantized_matmul), so a forward reads its
    own tokens quantized. Bytes: the packed uint32 codes, scales and biases of the tokens held.

    Defaults are the class's (bits 8, group 64). mlx-lm's generate with kv_bits holds a plain
    KVCache and converts it after the forward in which it reaches quantized_kv_start (5000 by
    default), so its first prompt tokens attend each other in full precision: this method is
    generate_step with prompt_cache=[QuantizedKVCache(group_size, bits), ...] instead.
    """

    cache_class = "QuantizedKVCache"
    holds = "packed uint32 codes, a scale and a bias per group at the model's dtype, every token"

    bits: int = param(8, range=one_of(*BITS), meaning="bits per code (mx.quantize's affine"
                      " mode)", rule="the head_dim // (32 // bits) words mlx-lm makes room for"
                      " must be a token's codes exactly (at head_dim 128, 5 and 6 bits are not)")
    group_size: int = param(64, range=one_of(*GROUP_SIZES), meaning="channels that share a"
                            " scale and a bias", rule="divides head_dim")

    def supports(self) -> Capabilities:
        # every token it saw stays, so any can be taken back (QuantizedKVCache.trim)
        return dataclasses.replace(self.capabilities, trim=True)

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim % self.group_size:
            raise SettingError("group_size", f"group_size {self.group_size} does not divide"
                                             f" head_dim {head_dim}")
        # QuantizedKVCache sizes a token's codes as head_dim // (32 // bits) words
        words, sized = head_dim * self.bits / 32, head_dim // (32 // self.bits)
        if words != sized:
            raise SettingError("bits", f"{self.bits}-bit codes of {head_dim} values take"
                                       f" {words:g} uint32 words, but mlx-lm's QuantizedKVCache"
                                       f" makes room for {sized}")

    def describe(self) -> str:
        return f"{self.bits} bits, group {self.group_size}"


@register_method("mlx-lm-rotating")
@dataclass
class MLXLMRotating(MLXLMCache):
    """mlx-lm's RotatingKVCache: the first `keep` tokens and the newest ones, `max_size` in all;
    a one-token step overwrites the oldest of the others in place (the keys are then not in
    temporal order, which attention does not need), and a forward of S tokens reads the last
    max_size - 1 before it and its own, under a sliding-window mask of max_size, so each query
    sees max_size keys (the cache's make_mask). Positions go on from every token seen. Bytes:
    the keys and values of the tokens held (max_size after a one-token step; up to
    max_size - 1 + S after an S-token forward, until the next step trims them).

    Defaults: keep 4, as mlx-lm's make_prompt_cache(model, max_kv_size) builds it (the class
    itself defaults to 0). mlx-lm's generate ignores max_kv_size for a model that makes its own
    caches (Model.make_cache: llama's, in mlx-lm 0.32): pass it prompt_cache there.
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"max_size": 32}, {"max_size": 20, "keep": 0})

    cache_class = "RotatingKVCache"
    holds = "the keys and values of the tokens it holds, at the model's dtype"

    max_size: int = param(range=at_least(1), meaning="the tokens the cache holds after a"
                          " one-token step, the kept first ones included")
    keep: int = param(4, range=at_least(0), meaning="the first tokens always kept (attention"
                      " sinks)", rule="below max_size")

    def check(self) -> None:
        super().check()
        if self.keep >= self.max_size:
            raise SettingError("keep", f"keep ({self.keep}) must be below max_size"
                                       f" ({self.max_size}): no room is left to rotate")

    def describe(self) -> str:
        return f"max_size {self.max_size}, keep {self.keep}"
