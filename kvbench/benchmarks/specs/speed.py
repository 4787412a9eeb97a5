"""`speed`: how fast a codec encodes and decodes, against a plain memory copy of the same bytes.

Vectors (1, 1, n, dim) in `dtype` are encoded, decoded and copied (on torch, copy_ into one
buffer kept across repeats: one read and one write of the input, the memcpy baseline; on MLX a new
array) in every repeat, so each repeat's ratio to memcpy compares runs made moments apart on the
same, possibly noisy, machine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from kvbench.backends.devices import DTYPE_BYTES
from kvbench.config.fields import Settings, SettingError, at_least, param
from kvbench.benchmarks.records.speed import SpeedRecord
from kvbench.benchmarks.reports.speed import REPORT
from kvbench.benchmarks.specs.base import (
    VECTORS_PER_TOKEN, Benchmark, MetricSpec, register_benchmark,
)
from kvbench.models.info import ModelInfo

RAM_SHARE = 0.5  # refuse settings whose estimate is above this share of physical RAM


@dataclass
class SpeedParams(Settings):
    """Parameters of the speed benchmark."""

    n_vectors: int = param(1_000_000, range=at_least(1), meaning="vectors encoded per call")
    dim: int = param(128, range=at_least(1), meaning="head_dim")
    dtype: Literal["float16", "bfloat16", "float32"] = param(
        "float16", meaning="the input the cache would hold")
    data: Literal["gaussian", "sphere", "outliers"] = param("gaussian",
                                                            meaning="synthetic vectors")
    chunk: int = param(0, range=at_least(0), meaning="0 encodes all vectors in one call; else"
                       " calls of this many vectors, which bounds the codec's temporaries (the"
                       " timings then include the per-call overhead)")
    data_seed: int = param(0, meaning="seed of the synthetic data")
    warmup: int = param(1, range=at_least(0), meaning="untimed rounds of encode, decode and copy"
                        " before the timed ones")


def estimate_bytes(params: SpeedParams) -> int:
    """Rough peak memory of a run: six input-sized tensors (the input; packed, at most the
    input's size, and decoded, each twice while a repeat replaces the last one's; the copy) and
    float32 temporaries of one encode call (intq holds about three copies of what it encodes)."""
    values = params.n_vectors * params.dim
    block = min(params.chunk or params.n_vectors, params.n_vectors) * params.dim
    return 6 * values * DTYPE_BYTES[params.dtype] + 3 * 4 * block


def physical_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@register_benchmark("speed")
class Speed(Benchmark):
    """Encode and decode throughput of a method's codec, and its ratio to a memory copy of the
    same bytes measured in the same repeat. Needs a method with a codec."""
    measured_in = "kvbench.benchmarks.measure.speed"
    report = REPORT
    record = SpeedRecord

    Params = SpeedParams
    backends = ("torch", "mlx")
    metrics = {
        "encode_vectors_s": MetricSpec("vectors/s", "higher", "vectors encoded per second",
                                       timing="absolute"),
        "decode_vectors_s": MetricSpec("vectors/s", "higher", "vectors decoded per second",
                                       timing="absolute"),
        "encode_gb_s": MetricSpec("GB/s", "higher", "input bytes encoded per second (1e9)",
                                  timing="absolute"),
        "decode_gb_s": MetricSpec("GB/s", "higher", "decoded output bytes per second (1e9)",
                                  timing="absolute"),
        "memcpy_gb_s": MetricSpec("GB/s", "none", "input bytes copied per second (1e9)",
                                  timing="absolute"),
        "encode_vs_memcpy": MetricSpec("x", "higher", "encode GB/s / memcpy GB/s, per repeat",
                                       timing="ratio"),
        "decode_vs_memcpy": MetricSpec("x", "higher", "decode GB/s / memcpy GB/s, per repeat",
                                       timing="ratio"),
        "nbytes": MetricSpec("bytes", "none", "codec bytes of all vectors"),
        "compression_ratio": MetricSpec("x", "higher", "16-bit bytes / codec bytes"),
    }

    def workload(self, params: SpeedParams) -> float:
        return params.n_vectors / VECTORS_PER_TOKEN

    def check(self, params: SpeedParams, model: ModelInfo | None) -> None:
        need, ram = estimate_bytes(params), physical_ram()
        if need > RAM_SHARE * ram:
            raise SettingError(
                "n_vectors", f"n_vectors: {params.n_vectors} x dim {params.dim} ({params.dtype})"
                f" needs about {need / 1e9:.1f} GB, above {RAM_SHARE:.0%} of this machine's"
                f" {ram / 1e9:.1f} GB of RAM; lower n_vectors (chunk bounds only the"
                " temporaries)")
