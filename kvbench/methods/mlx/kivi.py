"""`kivi` on MLX: 2/4-bit keys per channel, values per token, the newest tokens in full precision
(kvbench.methods.kivi), codecs and the KiviCache policy."""
from __future__ import annotations

from kvbench.methods.kivi import Kivi, KiviCache
from kvbench.methods.mlx.base import MLX_OPS, MLXMethod, mlx_implementation
from kvbench.methods.mlx.intq import MLXIntQCodec


class MLXKiviCache(KiviCache):
    """KiviCache on mx.array (kvbench.methods.mlx.base.MLXOps)."""

    ops = MLX_OPS


@mlx_implementation(Kivi)
class MLXKivi(MLXMethod):
    """Kivi on MLX; config: kvbench.methods.kivi.Kivi (bits, group_size, residual). codec() is
    None: keys (per channel) and values (per token) use different codecs."""

    def key_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.config.bits, self.config.group_size, "channel")

    def value_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.config.bits, self.config.group_size, "token")

    def new_layer_cache(self, layer_idx: int) -> MLXKiviCache:
        config = self.config
        return MLXKiviCache(self.key_codec(), self.value_codec(), config.residual,
                            config.group_size)
