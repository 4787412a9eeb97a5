"""Wrappers that vary a base method's `bits` (decay, adaptive): building the base at each width,
the errors for widths it refuses, and choosing the nearest width it takes."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from kvbench.methods.base import METHODS, Method, build_method
from kvbench.registry import UnknownName

MAX_BITS = 8


def bit_variants(base: str, base_params: dict[str, Any],
                 widths: Iterable[int]) -> dict[int, Method]:
    """`base` built with `base_params` at each of `widths` that it accepts, {bits: method}.

    ValueError naming `base` when it is unknown or has no integer `bits` field, naming
    `base_params` when they set bits or when the base refuses every width with them.
    """
    if not isinstance(base, str) or not base:
        raise ValueError(f"base must be a method name, got {base!r}")
    try:
        cls = METHODS.get(base)
    except UnknownName as exc:
        raise ValueError(f"base: {exc}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if "bits" not in fields or fields["bits"].type not in (int, "int"):
        raise ValueError(f"base: method {base!r} has no integer `bits` field to vary")
    if not isinstance(base_params, dict):
        raise ValueError(f"base_params must be a mapping, got {base_params!r}")
    if "bits" in base_params:
        raise ValueError("base_params must not set bits: the wrapper chooses the widths")
    variants: dict[int, Method] = {}
    errors: dict[int, str] = {}
    for bits in widths:
        try:
            variants[bits] = build_method(base, {**base_params, "bits": bits})
        except (TypeError, ValueError) as exc:
            errors[bits] = str(exc)
    if not variants:
        first = next(iter(errors.items()), (None, "no width to try"))
        raise ValueError(f"base_params: {base!r} with {base_params} refuses every width"
                         f" ({first[0]} bits: {first[1]})")
    return variants


def refused(name: str, value: int, base: str, variants: dict[int, Method],
            base_params: dict[str, Any]) -> ValueError:
    """The error for a width `base` does not take, with the base's own reason and the ones it
    does take."""
    try:
        build_method(base, {**base_params, "bits": value})
        reason = ""
    except (TypeError, ValueError) as exc:
        reason = f" ({exc})"
    return ValueError(f"{name}: {base!r} does not accept {value!r} bits{reason}; it accepts"
                      f" {', '.join(str(b) for b in sorted(variants))} here")


def nearest_width(target: float, widths: list[int], tie_toward: float) -> int:
    """The width in `widths` nearest to `target`; a tie goes to the one nearer `tie_toward`."""
    return min(widths, key=lambda b: (abs(b - target), abs(b - tie_toward)))


def check_width(name: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_BITS:
        raise ValueError(f"{name} must be an int in {low}..{MAX_BITS}, got {value!r}")
