"""transformers' quantized cache layers on torch (settings: kvbench.methods.settings.hf_quantized).
Each policy holds one layer object of the library's own class and hands attention exactly what
its update() returns, as transformers' QuantizedCache does inside generate().

generate() prefills a prompt in one forward: the layer's first update() quantizes the whole
prompt once and returns it in full precision. A prompt prefilled in chunks is held here in full
precision until end_prefill hands it to the layer in one update(), so that chunks read what
one forward would and the layer ends as generate's: chunk by chunk, every flush of the
residual would dequantize the layer and quantize it again (the prompt's tokens rounded twice,
and the library's full-precision copies of the layer at every chunk)."""
from __future__ import annotations

from typing import Any

import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS, storage_bytes
from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.core.tail import Tail
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
    residual, and the keys and values its last update() returned for attention; until
    end_prefill, the prompt (module docstring)."""

    def __init__(self, layer: Any):
        self.layer = layer
        self.read: tuple[torch.Tensor, torch.Tensor] | None = None
        self.prompt: tuple[Tail, Tail] | None = (Tail(TORCH_ARRAYS), Tail(TORCH_ARRAYS))
        self.reserved = 0

    def reserve(self, tokens: int) -> None:
        self.reserved = tokens

    def append(self, keys, values, queries=None) -> None:
        if self.prompt is not None:
            for tail, x in zip(self.prompt, (keys, values)):
                tail.extend(x, self.reserved)
            return
        # the last read is released first: update() dequantizes the whole layer again, and
        # holding the old read through it would add one more full-precision copy to the peak
        self.read = None
        self.read = self.layer.update(keys, values)

    def end_prefill(self) -> None:
        prompt, self.prompt = self.prompt, None
        if prompt is not None and prompt[0].tokens:
            self.layer.update(prompt[0].array, prompt[1].array)  # returns the prompt: unread

    def attention_inputs(self):
        if self.prompt is not None:
            return self.prompt[0].array, self.prompt[1].array, None
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
        return self.layer.cumulative_length + self._prompt_tokens()

    @property
    def retained_tokens(self) -> int:
        return self.seen_tokens  # quantized, never dropped

    @property
    def retained_bytes(self) -> int:
        prompt = [tail.array for tail in self.prompt or () if tail.tokens]
        return self._layer_bytes() + stored_bytes(prompt)

    def measured_bytes(self) -> int:
        buffers = [tail.held for tail in self.prompt or ()]
        return self._layer_bytes() + storage_bytes(*(self.read or ()), *buffers)

    def _layer_bytes(self) -> int:
        # the layer keeps its quantized tensors in these attributes only (transformers 4.56-5.x)
        return stored_bytes([getattr(self.layer, "_quantized_keys", None),
                             getattr(self.layer, "_quantized_values", None), self.residual()])

    def _prompt_tokens(self) -> int:
        return 0 if self.prompt is None else self.prompt[0].tokens

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
