"""`proofs`: what a codec does to vectors: bytes, reconstruction error, inner products, attention.

Keys and values (1, heads, T, D) are cast to `dtype` (the original the cache would hold), encoded
and decoded by the method's codecs alone, never through its cache (no full-precision sinks or
window, no requantization or eviction); every error is measured against that original in float64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvbench.config.fields import Settings, SettingError, at_least, param
from kvbench.benchmarks.records.proofs import ProofsRecord
from kvbench.benchmarks.reports.proofs import REPORT
from kvbench.benchmarks.specs.base import (
    VECTORS_PER_TOKEN, Benchmark, MetricSpec, register_benchmark,
)
from kvbench.models.info import ModelInfo

# Each repeat alternates ROUNDS timed batches of a plain copy and of the operation: on a shared
# machine a batch is preempted now and then (and takes milliseconds longer), never every one of
# them, so the fastest is the work itself. A batch lasts at least BATCH_S, so an operation of a
# few microseconds is timed over many calls, not at the clock's grain.
ROUNDS = 10
BATCH_S = 1e-4


@dataclass
class ProofsParams(Settings):
    """Parameters of the proofs benchmark."""

    data: Literal["gaussian", "sphere", "outliers", "captured"] = param(
        "gaussian", meaning="synthetic vectors, or K/V captured from the suite's model over the"
        " bundled pydoc text")
    n_vectors: int = param(4096, range=at_least(1), meaning="synthetic vectors per tensor (keys"
                           " and values are independent draws)")
    dim: int = param(64, range=at_least(1), meaning="synthetic head_dim")
    dtype: Literal["float16", "bfloat16", "float32"] = param(
        "float16", meaning="the original the cache would hold")
    layers: list[int] = param(factory=lambda: [0], rule="non-empty, each >= 0",
                              meaning="captured layers; their heads are stacked")
    tokens: int = param(512, range=at_least(1), meaning="captured tokens")
    n_queries: int = param(64, range=at_least(1), meaning="queries for the inner-product and"
                           " attention errors")
    data_seed: int = param(0, meaning="seed of the synthetic data (queries use the run's seed)")

    def check(self) -> None:
        if not self.layers or any(layer < 0 for layer in self.layers):
            raise SettingError("layers", f"layers must be a non-empty list of indices >= 0, got"
                                         f" {self.layers}")


@register_benchmark("proofs")
class Proofs(Benchmark):
    """Codec fidelity on synthetic or captured K/V: ratio, bits/value, MSE, cosine, inner-product
    and attention-output error, encode/decode time. Needs a method with a codec. Measures the
    bare codecs: a method's cache policy (full-precision sinks or window, requantization,
    eviction, sparse reads) is not applied, so a claim on a method that has one is refused."""
    measured_in = "kvbench.benchmarks.measure.proofs"
    report = REPORT
    record = ProofsRecord
    # every vector goes through the codecs, none through the cache: a suite's claim on a method
    # whose settings' policy_beyond_codec() is not empty is refused (kvbench.suite.expand)
    codecs_only = True

    Params = ProofsParams
    # Synthetic data needs no model (uses_model stays False); check() refuses data "captured"
    # when the suite names none.
    backends = ("torch", "mlx")
    metrics = {
        "compression_ratio": MetricSpec("x", "higher", "16-bit bytes of K and V / codec bytes"),
        "bits_per_value": MetricSpec("bits", "lower", "8 * codec bytes / values, K and V"),
        "mse": MetricSpec("", "lower", "mean squared error over K and V"),
        "cosine": MetricSpec("", "higher", "mean per-vector cosine similarity, K and V"),
        "ip_rel_error": MetricSpec("", "lower", "||Q K_hat^T - Q K^T||_F / ||Q K^T||_F"),
        "ip_bias": MetricSpec("", "none", "mean of <q,k_hat> - <q,k>, over the RMS of <q,k>"),
        "ip_error_std": MetricSpec("", "lower", "std of <q,k_hat> - <q,k>, over the RMS of <q,k>"),
        "attn_kl": MetricSpec("nats", "lower", "KL(softmax(QK^T) || softmax(QK_hat^T)) per query"),
        "attn_output_error": MetricSpec("", "lower", "relative Frobenius error of attention out"),
        "nbytes": MetricSpec("bytes", "none", "codec bytes of K and V"),
        "encode_ms": MetricSpec("ms", "lower", f"encode K and V, fastest of {ROUNDS} per repeat",
                                timing="absolute"),
        "decode_ms": MetricSpec("ms", "lower", f"decode K and V, fastest of {ROUNDS} per repeat",
                                timing="absolute"),
        "encode_vs_memcpy": MetricSpec("x", "higher", "the case's fastest plain copy of K and V"
                                       " / encode_ms, timed alongside", timing="ratio"),
        "decode_vs_memcpy": MetricSpec("x", "higher", "the case's fastest plain copy of K and V"
                                       " / decode_ms, timed alongside", timing="ratio"),
    }

    def head_dim(self, params: ProofsParams, model: ModelInfo | None) -> int | None:
        if params.data == "captured":
            return model.head_dim if model is not None else None
        return params.dim

    def workload(self, params: ProofsParams) -> float:
        if params.data == "captured":
            return float(params.tokens)  # one forward; its layers' K/V are then encoded
        return params.n_vectors / VECTORS_PER_TOKEN

    def check(self, params: ProofsParams, model: ModelInfo | None) -> None:
        if params.data != "captured":
            return
        if model is None:
            raise SettingError("data", "data: captured needs a model; set the suite's model")
        self.check_length(model, "tokens", params.tokens, "tokens")
        count = len(model.layer_kinds)  # 0: the config does not say (the bundled model)
        beyond = [layer for layer in params.layers if count and layer >= count]
        if beyond:
            raise SettingError("layers", f"layers {beyond} are not layers of {model.spec}, which"
                                         f" has {count} (0 to {count - 1})")
