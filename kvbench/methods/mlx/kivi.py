"""`kivi` on MLX: keys per channel and values per token by intq's MLX codec, the newest tokens in
full precision (kvbench.methods.settings.kivi), in KIVI's layer cache on mx.array."""
from __future__ import annotations

from kvbench.backends.mlx_arrays import MLX_ARRAYS
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.core.kivi_cache import KiviCache
from kvbench.methods.mlx.intq import MLXIntQCodec
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.kivi import Kivi


@implements(Kivi, backend="mlx")
class MLXKivi(Implementation):
    """codec() is None: keys (per channel) and values (per token) use different codecs."""

    settings: Kivi

    def key_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.settings.bits, self.settings.group_size, "channel")

    def value_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.settings.bits, self.settings.group_size, "token")

    def new_layer_cache(self, layer_idx: int) -> KiviCache:
        s = self.settings
        return KiviCache(self.key_codec(), self.value_codec(), s.residual, s.group_size,
                         MLX_ARRAYS)
