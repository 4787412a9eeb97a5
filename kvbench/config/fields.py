"""Declared parameters. Every field of a settings dataclass (a method's settings, a benchmark's
Params) states its type (the annotation), its default, its range and its meaning, with param():

    bits: int = param(4, range=one_of(2, 4, 8), meaning="bits per code")

Validation (Settings.__post_init__), `kvbench list`, the suite's file:line blame and the
torch-free `kvbench validate` all read these declarations. A rule that ties fields together is
checked in the class's check() and raised as SettingError naming the field to blame; its text
for `kvbench list` is the field's `rule`.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Literal

from kvbench.config.registry import did_you_mean

META = "kvbench"  # the key of a field's metadata that holds its Declaration


class SettingError(ValueError):
    """A setting that cannot be: `field` names the parameter to blame, or a tuple of them (the
    first one a suite sets is blamed), or None for the settings as a whole; the message names it
    too."""

    def __init__(self, field: str | tuple[str, ...] | None, message: str):
        super().__init__(message)
        self.field = field

    @property
    def fields(self) -> tuple[str, ...]:
        if self.field is None:
            return ()
        return (self.field,) if isinstance(self.field, str) else tuple(self.field)


class LibraryMissing(SettingError):
    """A setting this installation cannot build: the library it runs (an optional extra) is not
    installed. A suite refuses the cases that need it, naming the install line, and runs the
    rest."""


@dataclass(frozen=True)
class Range:
    """The numbers a parameter takes: bounds, each open or closed, or a set of values."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    values: tuple = ()
    span: bool = False  # integers low..high, written "1..8"

    def holds(self, value: Any) -> bool:
        if self.values:
            return value in self.values
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            return False
        if self.span and not isinstance(value, int):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.values:
            *first, last = map(str, self.values)
            return f"{', '.join(first)} or {last}" if first else last
        if self.span:
            return f"in {self.low:g}..{self.high:g}"
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.high_open else ']'}")


def at_least(low: float) -> Range:
    return Range(low=low)


def above(low: float) -> Range:
    return Range(low=low, low_open=True)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Range:
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


def span(low: int, high: int) -> Range:
    """Integers from low to high, both included."""
    return Range(low=low, high=high, span=True)


def one_of(*values: Any) -> Range:
    return Range(values=values)


@dataclass(frozen=True)
class Declaration:
    meaning: str
    range: Range | None = None
    rule: str = ""  # a constraint check() enforces across fields, as `kvbench list` shows it

    def range_text(self) -> str:
        return "; ".join(part for part in (str(self.range or ""), self.rule) if part)


def param(default: Any = MISSING, *, meaning: str, range: Range | None = None, rule: str = "",
          factory: Any = MISSING, kw_only: bool = False) -> Any:
    """A dataclass field with its declaration (see the module docstring); `factory` for a
    mutable default; kw_only for a base class's field that its subclasses' fields must not
    follow positionally."""
    metadata = {META: Declaration(" ".join(meaning.split()), range, rule)}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata, kw_only=kw_only)
    return dataclasses.field(default=default, metadata=metadata, kw_only=kw_only)


class SettingErrors(SettingError):
    """Several settings that cannot be, each a SettingError in `errors` (blamed as the first
    when not taken apart): every bad field of a block is reported at once."""

    def __init__(self, errors: list[SettingError]):
        super().__init__(errors[0].field, "; ".join(map(str, errors)))
        self.errors = errors


def each_error(exc: BaseException) -> list[BaseException]:
    """The SettingErrors' errors, else [exc]."""
    return list(exc.errors) if isinstance(exc, SettingErrors) else [exc]


def declaration(field: dataclasses.Field) -> Declaration | None:
    return field.metadata.get(META)


class Settings:
    """Base of declared settings (a dataclass subclass): after __init__ every field's type (bool,
    int, float) and range (or, for a Literal field, its choices) is checked, the class's own
    fields before inherited ones; then check() runs the rules across fields. Both raise
    SettingError."""

    def __post_init__(self) -> None:
        errors = field_errors(type(self), {f.name: getattr(self, f.name)
                                           for f in dataclasses.fields(self)})
        if len(errors) > 1:
            raise SettingErrors(errors)
        if errors:
            raise errors[0]
        self.check()

    def check(self) -> None:
        """Rules across fields; raise SettingError(field, message)."""


_KIND_TEXT = {bool: "true or false", int: "an integer", float: "a number"}


def field_errors(cls: type, values: dict[str, Any]) -> list[SettingError]:
    """The values `cls` refuses field by field, for their type (bool, int, float) or range,
    the class's own fields first; the rules across fields (check()) are not run."""
    errors = []
    for name, kind, allowed in _field_checks(cls):
        value = values.get(name)
        if value is None:
            continue
        if kind is not None and not _is_a(value, kind):
            errors.append(SettingError(name, f"{name} must be {_KIND_TEXT[kind]}, got"
                                             f" {value!r}"))
        elif allowed is not None and not allowed.holds(value):
            hint = did_you_mean(value, map(str, allowed.values)) \
                if allowed.values and isinstance(value, str) else ""
            errors.append(SettingError(name, f"{name} must be {allowed}, got {value!r}{hint}"))
    return errors


def _is_a(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


@functools.cache
def _field_checks(cls: type) -> tuple[tuple[str, type | None, Range | None], ...]:
    """(field, the bool, int or float it must be or None, its range or None) for each checked
    field of a settings class, the most derived class's own fields first (a subclass's error
    wins over its base's, as the suite blames)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # a plug-in's annotation that does not resolve: ranges only
        hints = {}
    depth: dict[str, int] = {}
    for level, klass in enumerate(cls.__mro__):
        for name in inspect.get_annotations(klass):
            depth.setdefault(name, level)
    checks = []
    for field in sorted(dataclasses.fields(cls), key=lambda f: depth.get(f.name, len(depth))):
        annotation = _optional_of(hints.get(field.name))
        kind = annotation if annotation in _KIND_TEXT else None
        found = declaration(field)
        allowed = (found.range if found is not None else None) or choices(annotation)
        if kind is not None or allowed is not None:
            checks.append((field.name, kind, allowed))
    return tuple(checks)


def choices(annotation: Any) -> Range | None:
    """The values a Literal annotation (or an optional one) allows; None for any other."""
    annotation = _optional_of(annotation)
    if typing.get_origin(annotation) is Literal:
        return Range(values=typing.get_args(annotation))
    return None


def _optional_of(annotation: Any) -> Any:
    """X for an X | None annotation; the annotation itself otherwise."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation
