"""`lloydmax`: ManthanQuant-style per-vector norm plus N(0, 1) Lloyd-Max codes per coordinate."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import at_least, param, span
from kvbench.kernels.formats import lloydmax_unsupported
from kvbench.methods.settings.base import (
    IMPL_MEANING, Impl, KernelSettings, MethodSettings, register_method,
)
from kvbench.methods.settings.codec_policy import CodecPolicy, layers_param, sinks_param


@register_method("lloydmax")
@dataclass
class LloydMax(CodecPolicy, KernelSettings, MethodSettings):
    """ManthanQuant-style Lloyd-Max quantization of keys and values, the same codec for both.

    Scheme (ManthanQuant): per vector x of head_dim D, r = ||x|| is stored as float32;
    s = x / r * sqrt(D) has coordinates near N(0, 1); each is replaced by the index of the nearest
    N(0, 1) Lloyd-Max centroid, packed at `bits` bits, little-endian, spanning bytes.
    Decode: x_hat = c[index] / sqrt(D) * r. Faithful to upstream: no rotation and no norm
    correction, so outlier channels stay where they are and ||x_hat|| != ||x||.
    Bytes per vector: 4 + ceil(bits * D / 8); at D = 256, bits = 3: 100 B (5.12x against 16-bit).
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).

    Defaults: upstream atcuality2021/manthanquant manthanquant/x86_quantize.py tq_encode_torch
    (bits=3, float32 radius, N(0, 1) 3-bit table, no rotation; the CUDA kernel's seed is unused,
    manthanquant-x86 csrc/turboquant_kernel.cu, bits 2..4 only); rotate/window/sinks are kvbench's.
    """

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.lloydmax",
        "mlx": "kvbench.methods.mlx.lloydmax",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({}, {"rotate": True, "window": 8})

    bits: int = param(3, range=span(1, 8), meaning="bits per coordinate")
    rotate: bool = param(
        False, meaning="turn each vector by a seeded random orthogonal D x D matrix before coding"
        " and back after decoding (not upstream; shows what the missing rotation costs on keys"
        " with outlier channels). Not counted as stored bytes: it is regenerated")
    rotation_seed: int = param(0, range=at_least(0),
                               meaning="seed of the rotation's own generator, not the data's")
    window: int = param(0, range=at_least(0), meaning="newest tokens kept in full precision")
    sinks: int | None = sinks_param()
    layers: Literal["all", "full"] | None = layers_param()
    impl: Impl = param("auto", meaning=IMPL_MEANING + ". Kernels need rotate false,"
                       " head_dim >= 8")

    def kernel_unsupported(self) -> str | None:
        return lloydmax_unsupported(self.rotate)

    def kernel_fields(self) -> tuple[str, ...]:
        return ("rotate",)

    def token_block(self) -> int:
        return 1
