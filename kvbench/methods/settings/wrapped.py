"""Settings of methods that wrap another method (sparse_v, decay, adaptive): building the base's
settings, and for those that vary its `bits`, the widths it accepts."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from kvbench.config.fields import SettingError
from kvbench.config.registry import UnknownName
from kvbench.methods.settings.base import METHODS, MethodSettings, build_method

MAX_BITS = 8


def build_base(base: str, base_params: dict[str, Any]) -> MethodSettings:
    """The base method's settings; SettingError naming `base` when they are refused."""
    try:
        return build_method(base, base_params)
    except (TypeError, ValueError) as exc:
        raise SettingError("base", f"base {base!r} with base_params {base_params}: {exc}"
                           ) from None


def bit_variants(base: str, base_params: dict[str, Any],
                 widths: Iterable[int]) -> dict[int, MethodSettings]:
    """`base` built with `base_params` at each of `widths` that it accepts, {bits: settings}.

    SettingError naming `base` when it is unknown or has no integer `bits` field, naming
    `base_params` when they set bits or when the base refuses every width with them.
    """
    if not isinstance(base, str) or not base:
        raise SettingError("base", f"base must be a method name, got {base!r}")
    try:
        cls = METHODS.get(base)
    except UnknownName as exc:
        raise SettingError("base", f"base: {exc}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if "bits" not in fields or fields["bits"].type not in (int, "int"):
        raise SettingError("base", f"base: method {base!r} has no integer `bits` field to vary")
    if not isinstance(base_params, dict):
        raise SettingError("base_params", f"base_params must be a mapping, got {base_params!r}")
    if "bits" in base_params:
        raise SettingError("base_params", "base_params must not set bits: the wrapper chooses"
                                          " the widths")
    variants: dict[int, MethodSettings] = {}
    errors: dict[int, str] = {}
    for bits in widths:
        try:
            variants[bits] = build_method(base, {**base_params, "bits": bits})
        except (TypeError, ValueError) as exc:
            errors[bits] = str(exc)
    if not variants:
        first = next(iter(errors.items()), (None, "no width to try"))
        raise SettingError("base_params", f"base_params: {base!r} with {base_params} refuses"
                                          f" every width ({first[0]} bits: {first[1]})")
    return variants


def refused(name: str, value: int, base: str, variants: dict[int, MethodSettings],
            base_params: dict[str, Any]) -> SettingError:
    """The error for a width `base` does not take, with the base's own reason and the ones it
    does take."""
    try:
        build_method(base, {**base_params, "bits": value})
        reason = ""
    except (TypeError, ValueError) as exc:
        reason = f" ({exc})"
    return SettingError(name, f"{name}: {base!r} does not accept {value!r} bits{reason}; it"
                              f" accepts {', '.join(str(b) for b in sorted(variants))} here")


class BitWidths:
    """A wrapper that stores its base at several widths (decay, adaptive): `variants` is
    {bits: the base's settings at that width}, set by its check(); base_bits is the width a
    fresh (or uncalibrated) head uses."""

    variants: dict[int, MethodSettings]
    base_bits: int

    def widths(self) -> list[int]:
        """The widths used: those the base accepts among the ones tried."""
        return sorted(self.variants)

    def variant(self, bits: int) -> MethodSettings:
        """The base's settings with base_params at `bits` (one of widths())."""
        return self.variants[bits]

    def token_block(self) -> int | None:
        return self.variants[self.base_bits].token_block()

    def asks_every_layer(self) -> bool:
        """Its base was asked for every layer (base_params' layers: all); its own caches hold
        full-attention layers only, so a model with a sliding one is refused."""
        return any(settings.asks_every_layer() for settings in self.variants.values())

    def check_head_dim(self, head_dim: int) -> None:
        """The base's check, at every width it stores (blamed at base_params)."""
        for settings in self.variants.values():
            try:
                settings.check_head_dim(head_dim)
            except SettingError as exc:
                raise SettingError("base_params", f"base {type(settings).name!r}: {exc}"
                                   ) from None


def nearest_width(target: float, widths: list[int], tie_toward: float) -> int:
    """The width in `widths` nearest to `target`; a tie goes to the one nearer `tie_toward`."""
    return min(widths, key=lambda b: (abs(b - target), abs(b - tie_toward)))
