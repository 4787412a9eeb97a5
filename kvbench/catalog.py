"""The built-in methods and benchmarks as data (kvbench/catalog.json), so that `kvbench validate`
works where torch is not installed.

`python -m kvbench.catalog` writes the file from the registries (tests fail while it is stale).
`catalog_registries()` turns it back into stand-in classes with the same names, parameters,
parameter types, defaults and metrics; kvbench.suite.expand checks a suite against them as it
would against the real classes. What needs the code is not checked: the ranges a method's
__post_init__ refuses, a benchmark's check() (context above the model's limit, text files), and
methods or benchmarks from plugins.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Union

from kvbench.registry import Registry
from kvbench.suite.registries import Registries

CATALOG_FILE = Path(__file__).with_name("catalog.json")
NOTE = ("validated against the catalog of built-in methods and benchmarks (torch is not"
        " installed): parameter ranges, method capabilities, model limits and text files are"
        " not checked, and entry-point plugins are not loaded")
# The names a type text may use; rebuilt with eval over these alone.
_TYPE_NAMES = {t.__name__: t for t in (int, float, bool, str, list, dict, tuple)} | {
    "Any": Any, "Literal": Literal, "None": None}


# ---- writing it (needs torch) -----------------------------------------------------------------

def build_catalog(has_mlx: Callable[[type], bool] | None = None) -> dict:
    """Every built-in method and benchmark, from the registries; `has_mlx` says which methods
    run on MLX (default: kvbench's MLX implementations, which need MLX installed)."""
    from kvbench.benchmarks import BENCHMARKS
    from kvbench.methods import METHODS

    if has_mlx is None:
        import kvbench.methods.mlx  # noqa: F401 - registers the MLX implementations
        from kvbench.methods.mlx.base import has_mlx
    methods = {name: {**_describe(cls, cls), "mlx": has_mlx(cls)}
               for name, cls in _builtin(METHODS)}
    benchmarks = {
        name: {**_describe(cls, cls.Params), "uses_model": cls.uses_model,
               "backends": list(cls.backends),
               "metrics": {m: dataclasses.asdict(spec) for m, spec in cls.metrics.items()}}
        for name, cls in _builtin(BENCHMARKS)
    }
    return {"methods": methods, "benchmarks": benchmarks}


def catalog_text() -> str:
    return json.dumps(build_catalog(), indent=2) + "\n"


def _builtin(registry: Registry) -> list[tuple[str, type]]:
    """Registered by kvbench itself: not by a test or a plugin."""
    return [(name, registry.get(name)) for name in registry.names()
            if registry.get(name).__module__.startswith("kvbench.")]


def _describe(cls: type, config: type) -> dict:
    """Where `cls` lives, what its docstring opens with, and the fields of its dataclass
    `config`."""
    hints = typing.get_type_hints(config)
    params = []
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        param = {"name": f.name, "type": type_text(hints[f.name])}
        if f.default is not dataclasses.MISSING:
            param["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            param["default"] = f.default_factory()
        params.append(param)
    summary = (cls.__doc__ or "").strip().split("\n\n")[0]  # the docstring's first paragraph
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "doc": " ".join(summary.split()),
            "params": params}


def type_text(tp: Any) -> str:
    """A field's type as Python writes it: int | None, Literal['a', 'b'], tuple[int, ...]."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin in (Union, types.UnionType):
        return " | ".join(map(type_text, args))
    if origin in (list, dict, tuple):
        inner = ", ".join("..." if a is Ellipsis else type_text(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if tp in _TYPE_NAMES.values():
        return tp.__name__
    raise ValueError(f"the catalog cannot write type {tp!r}; teach type_text about it")


# ---- reading it (no torch) --------------------------------------------------------------------

@functools.cache  # one set of classes per process (expand.py caches adapters per class)
def catalog_registries() -> Registries:
    """Stand-ins for the built-in methods and benchmarks, made from the committed catalog."""
    catalog = json.loads(CATALOG_FILE.read_text())
    methods, benchmarks = Registry("method"), Registry("benchmark")
    for name, entry in catalog["methods"].items():
        cls = _dataclass(_class_name(entry), entry["params"],
                         {"__doc__": entry["doc"], "has_mlx": entry["mlx"]})
        methods.register(name)(cls)
    for name, entry in catalog["benchmarks"].items():
        params = _dataclass(_class_name(entry) + "Params", entry["params"], {})
        cls = type(_class_name(entry), (_CatalogBenchmark,), {
            "__doc__": entry["doc"], "Params": params, "metrics": entry["metrics"],
            "uses_model": entry["uses_model"], "backends": tuple(entry["backends"])})
        benchmarks.register(name)(cls)
    return Registries(methods, benchmarks, lambda: _catalog_has_mlx, NOTE)


class _CatalogBenchmark:
    """A built-in benchmark as the catalog has it: parameters and metrics, not its code."""

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        return params

    def check(self, params: Any, model: Any) -> None:
        """The real check needs the benchmark's code: not checked (see NOTE)."""


def _catalog_has_mlx(cls: type) -> bool:
    return cls.has_mlx


def _dataclass(name: str, params: list[dict], namespace: dict) -> type:
    """A dataclass with the catalog's fields: names, types, defaults."""
    fields = []
    for param in params:
        tp = eval(param["type"], {"__builtins__": {}}, _TYPE_NAMES)  # our own file, plain names
        if "default" not in param:
            fields.append((param["name"], tp))
        elif isinstance(param["default"], (list, dict)):
            value = param["default"]
            fields.append((param["name"], tp,
                           dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v))))
        else:
            fields.append((param["name"], tp, dataclasses.field(default=param["default"])))
    return dataclasses.make_dataclass(name, fields, kw_only=True, namespace=namespace)


def _class_name(entry: dict) -> str:
    return entry["class"].rpartition(":")[2]


if __name__ == "__main__":  # regenerate the committed catalog: python -m kvbench.catalog
    CATALOG_FILE.write_text(catalog_text())
