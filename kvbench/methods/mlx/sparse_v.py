"""`sparse_v` on MLX: the base method's MLX cache, read sparsely at decode
(kvbench.methods.sparse_v). Only the policy side lives here: the attention that skips value rows
and reports them through record_sparse_v is the MLX host's (kvbench.models.mlx_attention)."""
from __future__ import annotations

from typing import Any

from kvbench.methods.base import Codec, LayerCachePolicy
from kvbench.methods.mlx.base import MLXMethod, mlx_implementation, on_mlx
from kvbench.methods.sparse_v import SparseV, SparseVCache


class MLXSparseVCache(SparseVCache):
    """SparseVCache around an MLX policy: it stores exactly what `inner` stores and has the same
    value_skip_threshold (tau), record_sparse_v and counters (sparse_v_rows_skipped,
    sparse_v_rows, sparse_v_output_error_sum, sparse_v_steps, after the inner policy's own).
    The torch class holds no tensor of its own, so it runs on mx.array unchanged."""

    def __init__(self, inner: LayerCachePolicy, tau: float):
        super().__init__(inner, tau)


@mlx_implementation(SparseV)
class MLXSparseV(MLXMethod):
    """SparseV on MLX; config: kvbench.methods.sparse_v.SparseV (base, base_params, tau).

    The base is the config's own base method (config._base, built from base and base_params) as
    MLX runs it, so what calibrating either backend stores on it (adaptive's widths) serves
    both."""

    def __init__(self, config: SparseV):
        super().__init__(config)
        self.base = on_mlx(config._base)

    def new_layer_cache(self, layer_idx: int) -> MLXSparseVCache:
        return MLXSparseVCache(self.base.new_layer_cache(layer_idx), self.config.tau)

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        self.base.calibrate(stats, tokens)

    def key_codec(self) -> Codec | None:
        return self.base.key_codec()

    def value_codec(self) -> Codec | None:
        return self.base.value_codec()
