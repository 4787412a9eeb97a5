"""kvbench's optional parts (pyproject's extras) and the modules each brings: what a command or a
suite needs is named, with its install line, before any work starts."""
from __future__ import annotations

import importlib.util

# the modules an extra installs that kvbench imports (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "transformers"),
    "serve": ("fastapi", "uvicorn", "sse_starlette", "httpx", "prometheus_client"),
    "kvpress": ("kvpress",),
}


def missing_modules(extra: str) -> list[str]:
    """The extra's modules that cannot be imported here."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def lacks(extra: str, who: str) -> str | None:
    """None when the extra is installed; else e.g. "kvbench serve needs the serve extra (no
    module httpx): pip install 'kvbench[serve]'"."""
    missing = missing_modules(extra)
    if not missing:
        return None
    return (f"{who} needs the {extra} extra (no module {', '.join(missing)}):"
            f" pip install 'kvbench[{extra}]'")
