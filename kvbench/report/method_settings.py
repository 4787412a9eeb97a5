"""A case's method settings as a reader wants them: those that differ from the method's own
defaults (its settings dataclass's declared fields), read from the case's method_params. A
preset's defaults are its own (turbo3's bits are 3), so `turbo3` with block 64 reads
"block=64"; a method whose settings cannot be found here (a plug-in not installed where the
report is made) gets None, and the caller falls back on what differs between its cases."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from kvbench.config.describe import field_default
from kvbench.methods.settings import METHODS


def _same(value: Any, default: Any) -> bool:
    # results hold JSON: a default tuple reads back as a list
    def canonical(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=str)

    return canonical(value) == canonical(list(default) if isinstance(default, tuple) else default)


def defaults_of(method: str) -> dict[str, Any] | None:
    """Each declared field's default (dataclasses.MISSING where it has none); None when the
    method's settings class is not found here."""
    try:
        cls = METHODS.get(method)
    except Exception:  # unknown here, or a plug-in that fails to import
        return None
    if not dataclasses.is_dataclass(cls):
        return None
    return {f.name: field_default(f) for f in dataclasses.fields(cls)}


def non_default(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The params (a case's method_params) that differ from the method's defaults, in their
    order, a required field always among them; None when the method is not found here."""
    defaults = defaults_of(method)
    if defaults is None:
        return None
    return {key: value for key, value in params.items()
            if key not in defaults or defaults[key] is dataclasses.MISSING
            or not _same(value, defaults[key])}
