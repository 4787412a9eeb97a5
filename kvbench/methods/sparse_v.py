"""`sparse_v`: any method's cache, with value rows of negligible softmax weight skipped at
decode."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.methods.base import (
    Capabilities,
    Codec,
    LayerCachePolicy,
    Method,
    WrappedPolicy,
    build_method,
    register_method,
)


class SparseVCache(WrappedPolicy):
    """Stores exactly what `inner` stores; only the attention over it changes."""

    def __init__(self, inner: LayerCachePolicy, tau: float):
        super().__init__(inner)
        self.value_skip_threshold = tau
        self.rows_skipped = 0
        self.rows = 0
        self.output_error_sum = 0.0
        self.steps = 0

    def record_sparse_v(self, rows_skipped: int, rows: int, output_error: float) -> None:
        self.rows_skipped += rows_skipped
        self.rows += rows
        self.output_error_sum += output_error
        self.steps += 1

    def counters(self) -> dict[str, float]:
        # Sums over layers: the benchmark divides skipped by rows for the fraction.
        return {
            **self.inner.counters(),
            "sparse_v_rows_skipped": float(self.rows_skipped),
            "sparse_v_rows": float(self.rows),
            "sparse_v_output_error_sum": self.output_error_sum,
            "sparse_v_steps": float(self.steps),
        }


@register_method("sparse_v")
@dataclass
class SparseV(Method):
    """Sparse V: at each one-token decode step, skip the value rows whose softmax weight is below
    `tau` (TurboQuant+'s sparse-V: their dequantisation and their share of the weighted sum).

    Wraps any method: the cache stores what the base method stores (same bytes); attention runs in
    float32 with the skipped rows left out of the sum, not renormalised, as the kernel does. The
    cache counts rows skipped and the relative squared error of each step's attention output
    against the dense sum over the same cached values (its effect on output). Prefill is dense.

    Parameters:
        base: str = "identity" — the method whose cache is read sparsely.
        base_params: dict = {} — its parameters.
        tau: float = 1e-6 — softmax weight below which a value row is skipped (> 0).
    In a suite: `{name: sparse_v, params: {base: turbo3, tau: 1.0e-4}}`.
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {}, {"base": "turbo3", "base_params": {"block": 16}, "tau": 1e-3},
        {"base": "am", "base_params": {"ratio": 0.5, "queries": "repeat"}})

    base: str = "identity"
    base_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    tau: float = 1e-6

    def __post_init__(self):
        if self.base == "sparse_v":
            raise ValueError("base must be another method, not sparse_v")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau!r}")
        try:
            self._base = build_method(self.base, self.base_params)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"base {self.base!r} with base_params {self.base_params}: {exc}") from None

    def new_layer_cache(self, layer_idx: int) -> SparseVCache:
        return SparseVCache(self._base.new_layer_cache(layer_idx), self.tau)

    def supports(self) -> Capabilities:
        return self._base.supports()

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        self._base.calibrate(stats, tokens)

    def reference_probe(self, prompt: list[int]) -> list[int]:
        return self._base.reference_probe(prompt)

    def key_codec(self) -> Codec | None:
        return self._base.key_codec()

    def value_codec(self) -> Codec | None:
        return self._base.value_codec()

    def layout(self) -> str:
        return f"{self._base.layout()}; sparse-V at decode, tau {self.tau:g}"
