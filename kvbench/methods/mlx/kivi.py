"""`kivi` on MLX: keys per channel and values per token by intq's MLX codec, the newest tokens in
full precision (kvbench.methods.settings.kivi), in KIVI's layer cache on mx.array."""
from __future__ import annotations

from kvbench.methods.core.kivi_cache import KiviMethod
from kvbench.methods.mlx.intq import MLXIntQCodec
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.kivi import Kivi


@implements(Kivi, backend="mlx")
class MLXKivi(KiviMethod):
    settings: Kivi

    def key_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.settings.key_format())

    def value_codec(self) -> MLXIntQCodec:
        return MLXIntQCodec(self.settings.value_format())
