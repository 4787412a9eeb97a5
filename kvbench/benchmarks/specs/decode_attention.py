"""`decode_attention`'s declaration: one decode step's attention over a long cache, read packed by
the fused kernel, against torch SDPA over 16-bit K/V and against decode-then-SDPA; the protocol is
kvbench.benchmarks.measure.decode_attention's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvbench.config.fields import Settings, SettingError, at_least, param
from kvbench.benchmarks.records.decode_attention import DecodeAttentionRecord
from kvbench.benchmarks.reports.decode_attention import REPORT
from kvbench.benchmarks.specs.base import (
    VECTORS_PER_TOKEN, Benchmark, MetricSpec, register_benchmark,
)
from kvbench.models.info import ModelInfo

MAX_HEAD_DIM = 256  # the kernel's


@dataclass
class DecodeAttentionParams(Settings):
    """Parameters of the decode_attention benchmark."""

    context: int = param(4096, range=at_least(1), meaning="cached tokens the one query attends"
                         " to")
    q_heads: int = param(32, range=at_least(1), rule="a multiple of kv_heads",
                         meaning="query heads (GQA)")
    kv_heads: int = param(8, range=at_least(1), meaning="KV heads")
    head_dim: int = param(128, range=at_least(8), rule=f"<= {MAX_HEAD_DIM}",
                          meaning="channels per head of the queries and the K/V")
    batch: int = param(1, range=at_least(1), meaning="sequences, one query token each")
    dtype: Literal["bfloat16", "float16", "float32"] = param(
        "bfloat16", meaning="the query's and the plain K/V's")
    copies: int = param(0, range=at_least(0), meaning="K/V sets cycled through; 0: enough that"
                        " their plain K/V is 4x the last-level cache (CUDA's L2, the CPU's L3;"
                        " at most 64)")
    warmup: int = param(3, range=at_least(0), meaning="untimed calls of each path first"
                        " (compiles the kernels)")
    data_seed: int = param(0, meaning="seed of the random K/V and queries")

    def check(self) -> None:
        if self.q_heads % self.kv_heads:
            raise SettingError("q_heads", f"q_heads {self.q_heads} must be a multiple of kv_heads"
                                          f" {self.kv_heads}")


@register_benchmark("decode_attention")
class DecodeAttention(Benchmark):
    """One query token attending to `context` cached tokens: the method's packed K/V read by
    the fused kernel, torch SDPA over plain K/V, and decode-then-SDPA (the reference path),
    each timed in every repeat; their ratios, the fused kernel's read bandwidth against a device
    copy, and its error against attention over the decoded K/V. Needs a fused kernel: CUDA with
    triton, the CPU with numba (impl auto), or TRITON_INTERPRET=1 with impl triton."""
    measured_in = "kvbench.benchmarks.measure.decode_attention"
    report = REPORT
    record = DecodeAttentionRecord

    Params = DecodeAttentionParams
    backends = ("torch",)
    metrics = {
        "fused_us": MetricSpec("us", "lower", "fused attention over the packed K/V, per call",
                               timing="absolute"),
        "sdpa_us": MetricSpec("us", "lower", "torch SDPA over plain K/V in dtype, per call",
                              timing="absolute"),
        "decode_sdpa_us": MetricSpec("us", "lower", "decode the packed K/V, then SDPA, per call",
                                     timing="absolute"),
        "sdpa_vs_fused": MetricSpec("x", "higher", "sdpa_us / fused_us, per repeat: above 1 the "
                                    "fused kernel is faster", timing="ratio"),
        "decode_sdpa_vs_fused": MetricSpec("x", "higher", "decode_sdpa_us / fused_us, per repeat",
                                           timing="ratio"),
        "fused_gb_s": MetricSpec("GB/s", "higher", "packed K/V bytes read per second (1e9)",
                                 timing="absolute"),
        "memcpy_gb_s": MetricSpec("GB/s", "none", "bytes copied per second by a device copy "
                                  "(each read once and written once) (1e9)", timing="absolute"),
        "fused_read_vs_memcpy": MetricSpec("x", "higher", "fused_gb_s / memcpy_gb_s, per repeat "
                                           "(a kernel that only reads at the copy's rate "
                                           "scores 1; reading is cheaper than copying)",
                                           timing="ratio"),
        "rel_error": MetricSpec("ratio", "lower", "||fused - exact|| / ||exact||, exact: float64 "
                                "attention over the decoded K/V"),
        "kv_bytes": MetricSpec("bytes", "none", "packed K/V bytes of one copy"),
        "compression_ratio": MetricSpec("x", "higher", "16-bit K/V bytes / packed K/V bytes"),
    }

    def workload(self, params: DecodeAttentionParams) -> float:
        return params.batch * params.context / VECTORS_PER_TOKEN

    def check(self, params: DecodeAttentionParams, model: ModelInfo | None) -> None:
        if params.head_dim > MAX_HEAD_DIM:
            raise SettingError("head_dim", f"head_dim {params.head_dim} is above the kernel's"
                                           f" {MAX_HEAD_DIM}")
