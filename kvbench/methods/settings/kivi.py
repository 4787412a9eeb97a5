"""`kivi`: 2/4-bit keys per channel, values per token, the newest tokens in full precision."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import SettingError, at_least, one_of, param
from kvbench.kernels.formats import IntQFormat
from kvbench.methods.settings.base import (
    IMPL_MEANING, Impl, KernelSettings, MethodSettings, register_method,
)
from kvbench.methods.settings.codec_policy import WindowLayers, layers_param


@register_method("kivi")
@dataclass
class Kivi(WindowLayers, KernelSettings, MethodSettings):
    """KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache").

    Scheme: asymmetric min/max quantization (intq's codec): scale = (max - min) / (2^bits - 1)
    and min stored in float16, q = round((x - min) / scale) packed at `bits` bits. Keys are
    grouped per channel over `group_size` consecutive tokens, values per token over `group_size`
    channels. Bits per quantized value: bits + 32 / group_size (3.0 at bits=2, group_size=32),
    when head_dim is a multiple of group_size (a trailing partial group of channels has its own
    scale).

    Residual, as the upstream code (jy-yuan/KIVI, models/llama_kivi.py) does it: after a step has
    attended, raw keys are quantized in whole chunks of `residual` tokens (so T mod residual stay
    raw after T tokens) and values once they are older than the newest `residual` tokens (so
    min(T, residual) stay raw). The step's own tokens, and the chunk they complete, are attended in
    full precision and quantized at the next append (or end_prefill); the prefill attends to
    itself unquantized. Between steps, KIVI holds quantized + raw = every token seen. residual=0
    (not allowed upstream) quantizes keys in whole groups of `group_size` and every value.
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).

    Keys and values use different codecs (key_codec() and value_codec(); codec() is None).

    Defaults: docs/methods.md §KIVI (bits=2, group_size=32, residual=128); upstream
    jy-yuan/KIVI has no single default: utils/process_args.py ModelArguments (k_bits=v_bits=2,
    group_size=128, residual_length=128), example.py (k_bits=v_bits=2, group_size=32,
    residual_length=32).
    """

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.kivi",
        "mlx": "kvbench.methods.mlx.kivi",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"group_size": 8, "residual": 16}, {})

    bits: int = param(2, range=one_of(2, 4), meaning="bits per code, keys and values both")
    group_size: int = param(32, range=at_least(1), meaning="values per quantization group")
    residual: int = param(128, range=at_least(0), rule="a multiple of group_size",
                          meaning="newest tokens kept in full precision, counted at the model's"
                          " dtype")
    layers: Literal["all", "full"] | None = layers_param()
    impl: Impl = param("auto", meaning=IMPL_MEANING + ". Kernels need a power-of-two group_size"
                       " of at least 8 / bits")

    def check(self) -> None:
        if self.residual % self.group_size:
            raise SettingError("residual", f"residual must be a multiple of group_size"
                                           f" ({self.group_size}) and >= 0, got {self.residual!r}")
        self.check_impl()

    def key_format(self) -> IntQFormat:
        """The keys' layout (per channel over tokens), made here only."""
        return IntQFormat(self.bits, self.group_size, "channel")

    def value_format(self) -> IntQFormat:
        """The values' layout (per token over channels), made here only."""
        return IntQFormat(self.bits, self.group_size, "token")

    def kernel_unsupported(self) -> str | None:
        return self.key_format().unsupported() or self.value_format().unsupported()

    def kernel_fields(self) -> tuple[str, ...]:
        return "group_size", "bits"

    def token_block(self) -> int:
        return self.key_format().token_block  # the keys' groups span tokens
