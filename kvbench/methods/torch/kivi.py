"""`kivi` on torch: keys per channel and values per token by intq's codec, the newest tokens in
full precision (kvbench.methods.settings.kivi)."""
from __future__ import annotations

from kvbench.methods.core.kivi_cache import KiviMethod
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.kivi import Kivi
from kvbench.methods.torch.intq import IntQCodec


@implements(Kivi)
class TorchKivi(KiviMethod):
    settings: Kivi

    def key_codec(self) -> IntQCodec:
        return self.run_as(IntQCodec(self.settings.key_format()))

    def value_codec(self) -> IntQCodec:
        return self.run_as(IntQCodec(self.settings.value_format()))
