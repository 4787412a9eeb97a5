"""`intq`: plain asymmetric per-group integer quantization with fp16 scale and min."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import at_least, one_of, param
from kvbench.kernels.formats import IntQFormat
from kvbench.methods.settings.base import (
    IMPL_MEANING, Impl, KernelSettings, MethodSettings, register_method,
)
from kvbench.methods.settings.codec_policy import CodecPolicy, layers_param, sinks_param


@register_method("intq")
@dataclass
class IntQ(CodecPolicy, KernelSettings, MethodSettings):
    """Asymmetric per-group integer quantization of keys and values, the same codec for both.

    Scheme: per group of `group_size` values, min and max give scale = (max - min) / (2^bits - 1);
    scale and min are stored in float16; q = clamp(round((x - min) / scale), 0, 2^bits - 1), packed
    at `bits` bits. Bits per quantized value: bits + 32 / group_size. The first `sinks` and the
    newest `window` tokens stay in full precision and count at their dtype.
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).
    """

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.intq",
        "mlx": "kvbench.methods.mlx.intq",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"group_size": 16}, {"axis": "channel", "group_size": 8, "window": 8},
        {"group_size": 16, "sinks": 4, "window": 8})

    bits: int = param(4, range=one_of(2, 4, 8), meaning="bits per code")
    group_size: int = param(32, range=at_least(1), meaning="values per group")
    axis: Literal["token", "channel"] = param(
        "token", meaning="token: each token's head_dim channels are split into groups (a trailing"
        " partial group has its own scale); channel: each channel is grouped over group_size"
        " consecutive tokens, so the cache quantizes whole blocks of that many")
    window: int = param(0, range=at_least(0), meaning="newest tokens kept in full precision")
    sinks: int | None = sinks_param()
    layers: Literal["all", "full"] | None = layers_param()
    impl: Impl = param("auto", meaning=IMPL_MEANING + ". Kernels need a power-of-two group_size"
                       " of at least 8 / bits")

    def format(self) -> IntQFormat:
        """The layout its codec packs and its kernels read, made here only."""
        return IntQFormat(self.bits, self.group_size, self.axis)

    def kernel_unsupported(self) -> str | None:
        return self.format().unsupported()

    def kernel_fields(self) -> tuple[str, ...]:
        return "group_size", "bits"

    def token_block(self) -> int:
        return self.format().token_block
