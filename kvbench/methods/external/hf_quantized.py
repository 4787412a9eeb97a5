"""transformers' quantized cache layers on torch (settings: kvbench.methods.settings.hf_quantized).
Each policy holds one layer object of the library's own class and hands attention exactly what
its update() returns, as transformers' QuantizedCache does inside generate()."""
from __future__ import annotations

from typing import Any

import torch

from kvbench.backends.torch_arrays import storage_bytes
from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.hf_quantized import HFQuantized


def stored_bytes(held: Any) -> int:
    """Bytes of every tensor in `held` (tensors, tuples, dicts: HQQ's (codes, meta)), a tensor
    subclass (quanto's packed tensors) counted by the inner tensors it stores."""
    if isinstance(held, (tuple, list)):
        return sum(stored_bytes(item) for item in held)
    if isinstance(held, dict):
        return sum(stored_bytes(item) for item in held.values())
    if not isinstance(held, torch.Tensor):
        return 0
    if type(held) is not torch.Tensor and hasattr(held, "__tensor_flatten__"):
        names, _ = held.__tensor_flatten__()
        return sum(stored_bytes(getattr(held, name)) for name in names)
    return held.numel() * held.element_size()


class LibraryQuantizedLayer(LayerCachePolicy):
    """One model layer's transformers cache layer: what it quantized, its full-precision
    residual, and the keys and values its last update() returned for attention."""

    def __init__(self, layer: Any):
        self.layer = layer
        self.read: tuple[torch.Tensor, torch.Tensor] | None = None

    def append(self, keys, values, queries=None) -> None:
        # the last read is released first: update() dequantizes the whole layer again, and
        # holding the old read through it would add one more full-precision copy to the peak
        self.read = None
        self.read = self.layer.update(keys, values)

    def attention_inputs(self):
        if self.read is None:  # read again after after_read(): the layer's state, dequantized
            keys, values = (self.layer._dequantize(self.layer._quantized_keys),
                            self.layer._dequantize(self.layer._quantized_values))
            held = self.residual()
            if held:
                keys, values = torch.cat([keys, held[0]], -2), torch.cat([values, held[1]], -2)
            self.read = keys, values
        return (*self.read, None)

    def after_read(self) -> None:
        # attention holds what it reads: kept here too, every layer's full-precision read
        # would stay alive between steps (a whole plain cache beside the quantized one)
        self.read = None

    @property
    def seen_tokens(self) -> int:
        return self.layer.cumulative_length

    @property
    def retained_tokens(self) -> int:
        return self.layer.cumulative_length  # quantized, never dropped

    @property
    def retained_bytes(self) -> int:
        # the layer keeps its quantized tensors in these attributes only (transformers 4.56-5.x)
        return stored_bytes([self.layer._quantized_keys, self.layer._quantized_values,
                             self.residual()])

    def measured_bytes(self) -> int:
        return self.retained_bytes + storage_bytes(*(self.read or ()))

    def residual(self) -> list[torch.Tensor]:
        """The full-precision tokens the layer holds beside its quantized ones (none in FP8's,
        and an empty placeholder before the first flush)."""
        held = [getattr(self.layer, "keys", None), getattr(self.layer, "values", None)]
        return [t for t in held if t is not None and t.dim() == 4]


@implements(HFQuantized)
class TorchHFQuantized(Implementation):
    def new_layer_cache(self, layer_idx: int) -> LibraryQuantizedLayer:
        return LibraryQuantizedLayer(self.settings.new_layer())

    # the library's layers pack what they hold (no kvbench Codec): less than attention reads
    stores_reads = False

    def layout(self) -> str:
        return self.settings.layout()
