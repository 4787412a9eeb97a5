"""Dataclass parameters checked strictly, as a suite's YAML writes them: "4" or true for an int
is a mistake (a dataclass' own pydantic adapter would coerce them), a list for a tuple is not.
The suite loader and build_method (wrappers building their base) share these checks."""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs it below Python 3.12

from kvbench.config.registry import did_you_mean


def validate(cls: type, params: dict[str, Any]) -> Any:
    """`cls` built from `params` after the strict check of their YAML types; pydantic's
    ValidationError (with each error's location) otherwise."""
    _yaml_types(cls).validate_python(params, strict=True)
    return _adapter(cls).validate_python(params)


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


@functools.cache
def _yaml_types(cls: type) -> TypeAdapter:
    """The init fields of dataclass `cls` as YAML writes them, to validate strictly."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: _as_yaml(hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    return TypeAdapter(TypedDict(f"{cls.__name__}Fields", fields, total=False))  # type: ignore


def _as_yaml(tp: Any) -> Any:
    """`tp` with tuple[X, ...] read as list[X] (YAML has no tuples)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[_as_yaml(args[0])]  # type: ignore[misc]
    if origin in (Union, types.UnionType):
        return Union[tuple(map(_as_yaml, args))]
    if origin in (list, dict):
        return origin[tuple(map(_as_yaml, args))]
    return tp


def build_strict(cls: type, params: dict[str, Any]) -> Any:
    """`cls(**params)` after the strict check; ValueError naming the parameter otherwise."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in params:
        if key not in names:
            hint = did_you_mean(key, names) or f" Parameters: {', '.join(names) or 'none'}."
            raise ValueError(f"unknown parameter {key!r}.{hint}")
    try:
        return validate(cls, params)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"]))
        message = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}: {message}, got {err.get('input')!r}" if where
                         else message) from None
