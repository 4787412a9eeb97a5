"""Name -> class registries: a table of built-in names, each the module that registers it
(imported on first use), entry points for plug-ins, `module:Class` paths and did-you-mean."""
from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points
from typing import Callable, Generic, Mapping, TypeVar

T = TypeVar("T")


class UnknownName(LookupError):
    """A registry lookup failed; the message carries the suggestions."""


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), list(choices), n=3, cutoff=0.5)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class Registry(Generic[T]):
    """Classes registered by name: the built-ins' table (name -> the module whose import
    registers it), an entry-point group and `module:Class` strings, all loaded on first use."""

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 builtins: Mapping[str, str] | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.builtins = dict(builtins or {})
        self._classes: dict[str, type[T]] = {}
        self._broken: dict[str, str] = {}  # entry points that failed to load: why
        self._entry_points_loaded = False

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorate(cls: type[T]) -> type[T]:
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self._classes[name] = cls
            return cls

        return decorate

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or not self.entry_point_group:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            if ep.name in self._classes or ep.name in self.builtins:
                continue
            try:  # a broken plug-in must not take every other name down with it
                cls = ep.load()
            except Exception as exc:
                self._broken[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
                continue
            if not isinstance(cls, type):
                self._broken[ep.name] = f"{ep.value} is not a class"
                continue
            cls.name = ep.name
            self._classes[ep.name] = cls

    def names(self) -> list[str]:
        """Every name, the built-ins' without importing them."""
        self._load_entry_points()
        return sorted({*self.builtins, *self._classes})

    def _load_builtin(self, name: str) -> type[T]:
        importlib.import_module(self.builtins[name])
        if name not in self._classes:
            raise UnknownName(f"{self.kind} {name!r}: importing {self.builtins[name]} did not"
                              " register it")
        return self._classes[name]

    def get(self, name: str) -> type[T]:
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                cls = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise UnknownName(f"cannot import {self.kind} {name!r}: {exc}") from exc
            if not isinstance(cls, type):
                raise UnknownName(f"{self.kind} {name!r} is not a class")
            if not cls.__dict__.get("name"):  # not a name inherited from a registered parent
                cls.name = name
            return cls
        if name in self._classes:
            return self._classes[name]
        if name in self.builtins:
            return self._load_builtin(name)
        self._load_entry_points()
        if name in self._broken:
            raise UnknownName(f"{self.kind} plug-in {name!r} failed to load ({self._broken[name]})")
        if name not in self._classes:
            raise UnknownName(
                f"unknown {self.kind} {name!r}.{did_you_mean(name, self.names())}"
                f" Known: {', '.join(self.names())}."
            )
        return self._classes[name]
