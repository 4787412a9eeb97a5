"""`kivi` on torch: keys per channel and values per token by intq's codec, the newest tokens in
full precision (kvbench.methods.settings.kivi)."""
from __future__ import annotations

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.methods.core.kivi_cache import KiviCache
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.kivi import Kivi
from kvbench.methods.torch.base import TorchMethod
from kvbench.methods.torch.intq import IntQCodec


@implements(Kivi)
class TorchKivi(TorchMethod):
    settings: Kivi

    def key_codec(self) -> IntQCodec:
        return self.run_as(IntQCodec(self.settings.bits, self.settings.group_size, "channel"))

    def value_codec(self) -> IntQCodec:
        return self.run_as(IntQCodec(self.settings.bits, self.settings.group_size, "token"))

    def layout(self) -> str:
        return (
            f"keys: {self.key_codec().layout()}, quantized in chunks of {self.settings.residual} tokens; "
            f"values: {self.value_codec().layout()}, once older than the newest {self.settings.residual}; "
            "the rest full precision; K and V both counted"
        )


    def new_layer_cache(self, layer_idx: int) -> KiviCache:
        s = self.settings
        return KiviCache(self.key_codec(), self.value_codec(), s.residual, s.group_size,
                         TORCH_ARRAYS)
