"""kvbench's optional parts (pyproject's extras) and the modules each brings: what a command or a
suite needs is named, with its install line, before any work starts."""
from __future__ import annotations

import importlib.util

# the modules an extra installs that kvbench imports (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "transformers"),
    # the dataset benchmark: its data read through `datasets`, ROUGE-L from rouge-score
    "datasets": ("datasets", "rouge_score"),
    "serve": ("fastapi", "uvicorn", "sse_starlette", "httpx", "prometheus_client"),
    "kvpress": ("kvpress",),
    "mlx": ("mlx", "mlx_lm"),
    "quanto": ("optimum.quanto",),
    "hqq": ("hqq",),
    # llama-cpp-python's server as a stress or perplexity target (kvbench.serve.llama_cpp)
    "llama-cpp": ("llama_cpp", "pydantic_settings", "starlette_context"),
}


def missing_modules(extra: str) -> list[str]:
    """The extra's modules that cannot be imported here."""
    return [name for name in EXTRAS[extra] if not importable(name)]


def importable(name: str) -> bool:
    """Whether module `name` (dotted or not) can be found here, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is absent
        return False


def lacks(extra: str, who: str) -> str | None:
    """None when the extra is installed; else e.g. "kvbench serve needs the serve extra (no
    module httpx): pip install 'kvbench[serve]'"."""
    missing = missing_modules(extra)
    if not missing:
        return None
    return (f"{who} needs the {extra} extra (no module {', '.join(missing)}):"
            f" pip install 'kvbench[{extra}]'")
