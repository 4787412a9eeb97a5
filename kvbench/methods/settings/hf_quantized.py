"""`hf-quantized`: transformers' own quantized cache layers (QuantizedCache's quanto, HQQ and FP8
backends), run unchanged (kvbench.methods.external.hf_quantized runs them)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.extras import lacks, missing_modules
from kvbench.config.fields import LibraryMissing, SettingError, at_least, param
from kvbench.methods.settings.base import MethodSettings, PrefillReads, register_method

# backend -> (transformers.cache_utils layer class, the kvbench extra its library comes in)
BACKENDS = {"quanto": ("QuantoQuantizedLayer", "quanto"),
            "hqq": ("HQQQuantizedLayer", "hqq"),
            "fp8": ("Fp8QuantizedLayer", None)}
GROUP_WISE = ("nbits", "axis_key", "axis_value", "q_group_size", "residual_length")


@register_method("hf-quantized")
@dataclass
class HFQuantized(MethodSettings):
    """transformers' QuantizedCache, one layer object of the library's own class per model layer
    (QuantoQuantizedLayer, HQQQuantizedLayer, Fp8QuantizedLayer), built with these arguments:
    every step's keys and values go to the layer's update(), and attention reads what it
    returns, as in transformers' generate(cache_implementation="quantized"). The quanto and HQQ
    layers quantize the prompt whole at its first forward (which attends to itself in full
    precision), keep up to residual_length newer tokens in full precision and then re-quantize
    everything they hold (dequantized, joined, quantized again); FP8 quantizes per tensor with
    the scale of the first forward. Bytes: the quantized tensors the layer holds (packed codes,
    scales, zero points) plus its full-precision residual. Unset group-wise arguments take the
    layer's defaults (transformers: nbits 4, axes 0, group 64, residual 128); FP8 takes none.
    """

    implemented_in: ClassVar[dict[str, str]] = {"torch": "kvbench.methods.external.hf_quantized"}
    library_cache: ClassVar[bool] = True
    extra: ClassVar[str | None] = "quanto"  # the default backend's
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"backend": "quanto", "nbits": 2, "residual_length": 8},)

    backend: Literal["quanto", "hqq", "fp8"] = param(
        "quanto", meaning="QuantizedCache's backend: quanto (optimum-quanto, the quanto extra),"
        " hqq (the hqq extra) or fp8 (transformers 5.3 and later)")
    nbits: int | None = param(None, range=at_least(1), meaning="bits per code (quanto: 2, 4;"
                              " HQQ: 1, 2, 3, 4, 8)")
    axis_key: int | None = param(None, meaning="the axis the keys' groups run along (quanto: 0"
                                 " or -1; HQQ: 0 or 1)")
    axis_value: int | None = param(None, meaning="the same for the values")
    q_group_size: int | None = param(None, range=at_least(1), meaning="values per group")
    residual_length: int | None = param(None, range=at_least(1), meaning="the newest tokens held"
                                        " in full precision before all are re-quantized")
    # the layer's update() decides what attention reads, the step's own tokens included
    prefill_reads: PrefillReads = param(
        "stored", kw_only=True, meaning="stored: attention reads what the library's update()"
        " returns (the only reading a library's layer has)")

    def check(self) -> None:
        if self.prefill_reads != "stored":
            raise SettingError("prefill_reads", "hf-quantized reads what transformers' layer"
                                                " returns: prefill_reads must be stored")
        if not missing_modules("torch"):  # without torch (`kvbench validate`): not checked here
            self.new_layer()  # the library's own constructor checks its arguments

    def layer_kwargs(self) -> dict[str, Any]:
        """The group-wise arguments set, as QuantizedCache passes them (unset: left out)."""
        return {name: getattr(self, name) for name in GROUP_WISE
                if getattr(self, name) is not None}

    def new_layer(self) -> Any:
        """A fresh layer of transformers' class for the backend; SettingError naming the field
        for what the library or this installation refuses."""
        class_name, extra = BACKENDS[self.backend]
        missing = extra and lacks(extra, f"hf-quantized's {self.backend} backend")
        if missing:
            raise LibraryMissing("backend", missing)
        cache_utils = importlib.import_module("transformers.cache_utils")
        layer_class = getattr(cache_utils, class_name, None)
        if layer_class is None:
            version = importlib.import_module("transformers").__version__
            raise LibraryMissing("backend", f"transformers {version} has no {class_name}")
        kwargs = self.layer_kwargs()
        if self.backend == "fp8" and kwargs:
            raise SettingError(next(iter(kwargs)), "the fp8 backend quantizes per tensor and"
                                                   f" takes none of {', '.join(GROUP_WISE)}")
        try:
            return layer_class(**kwargs)
        except (ValueError, ImportError) as exc:
            blamed = next((name for name in GROUP_WISE if f"`{name}`" in str(exc)), "backend")
            raise SettingError(blamed, str(exc)) from None

    def describe(self) -> str:
        args = ", ".join(f"{name}={value}" for name, value in self.layer_kwargs().items())
        return f"{self.backend}" + (f" ({args})" if args else "")

    def layout(self) -> str:
        return (f"transformers QuantizedCache, {self.describe()}: the layer's quantized tensors"
                " (codes, scales, zero points) and its full-precision residual; K and V both"
                " counted")
