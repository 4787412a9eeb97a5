"""Models: the bundled checkpoint, tiny test models, spec loading and the cache adapter.

What validation needs (BUNDLED, describe_model) imports without torch; what loads a model
imports torch on first use.
"""
import importlib

from kvbench.models.home import kvbench_home
from kvbench.models.info import BUNDLED, describe_model

_NEED_TORCH = {
    "LoadedModel": "kvbench.models.loading",
    "load_model": "kvbench.models.loading",
    "prepare_bundled": "kvbench.models.bundled",
}

__all__ = ["BUNDLED", "describe_model", "kvbench_home", *_NEED_TORCH]


def __getattr__(name: str):
    if name in _NEED_TORCH:
        return getattr(importlib.import_module(_NEED_TORCH[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
