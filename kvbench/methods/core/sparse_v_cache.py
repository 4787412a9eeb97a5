"""Sparse-V's layer cache: the base method's cache, read sparsely by the attention at one-token
steps, which tells it what it skipped (kvbench.methods.settings.sparse_v)."""
from __future__ import annotations

from kvbench.methods.core.contracts import LayerCachePolicy
from kvbench.methods.core.wrapped_policy import WrappedPolicy


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
