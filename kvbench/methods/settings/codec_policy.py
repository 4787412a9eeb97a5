"""What a method stored by kvbench's codec cache (kvbench.methods.core.codec_cache.CodecCache)
keeps beside its codecs' packed tokens: the first `sinks` and the newest `window` tokens, in full
precision. A benchmark that measures the codecs alone (proofs) cannot see either. And which
layers a quantizer holds (`layers`): sliding-window layers too, as engines quantize them, or
full-attention layers only."""
from __future__ import annotations

from typing import Any, Literal

from kvbench.config.fields import at_least, param

SINKS_MEANING = "first tokens (attention sinks) kept in full precision, never packed; unset: none"


def sinks_param(default: int | None = None) -> Any:
    """The `sinks` field of a codec cache method's settings. Built-in methods default to None
    (no sinks): a 0 would be a new value in every result's method_params, and the gate matches
    only an unset setting with its absence from an older baseline."""
    return param(default, range=at_least(0), meaning=SINKS_MEANING)


LAYERS_MEANING = (
    "which attention layers the quantizer holds: all, sliding-window layers too (their tokens"
    " older than the window dropped, read under the window's mask, as vLLM's fp8 KV cache and"
    " llama.cpp's -ctk/-ctv quantize them), refused on a model with a window kvbench cannot"
    " hold (Llama 4's chunked attention, a hybrid layer's window); full, full-attention layers"
    " only, sliding ones kept by the library as the model keeps them; unset: all that kvbench"
    " can hold, the rest the library's")


def layers_param() -> Any:
    """The `layers` field of a quantizer's settings. Unset (None) by default, so that results
    recorded before it existed stay comparable (the gate matches an unset setting with its
    absence)."""
    return param(None, meaning=LAYERS_MEANING)


class WindowLayers:
    """Mixin for a quantizer's settings with the field `layers`: whether its caches hold
    sliding-window layers (kvbench.models.layer_kinds.hosted). A plug-in's settings without
    the field hold full-attention layers only, as before the field existed."""

    layers: Literal["all", "full"] | None

    def holds_windows(self) -> bool:
        """Its caches hold sliding-window layers (kvbench.methods.core.window_cache)."""
        return getattr(self, "layers", "full") != "full"

    def asks_every_layer(self) -> bool:
        """It was asked to hold every attention layer: a window it cannot hold is refused."""
        return getattr(self, "layers", None) == "all"


class CodecPolicy(WindowLayers):
    """Mixin for the settings of a method stored in a CodecCache (its fields `sinks` and
    `window`): says what its caches keep beside the packed tokens."""

    sinks: int | None
    window: int

    def policy_beyond_codec(self) -> list[str]:
        """See kvbench.methods.settings.base.MethodSettings.policy_beyond_codec."""
        parts = []
        if self.sinks:
            parts.append(f"first {self.sinks} tokens full precision (sinks)")
        if self.window:
            parts.append(f"newest {self.window} tokens full precision (window)")
        return parts
