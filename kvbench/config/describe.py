"""What `kvbench list` says about a method or benchmark, read from its declarations.

A description is a docstring's first sentence. A parameter is a field of the settings
dataclass: its type and default from the field, its range and meaning from its declaration
(kvbench.config.fields.param). Nothing is imported here beyond the standard library: the
caller has the classes.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from kvbench.config.fields import choices, declaration

UNKNOWN = "-"  # what the table shows where a plug-in declares nothing

# A full stop that ends a sentence: then a space or the end, and not the end of an abbreviation.
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bet al)(?<!\bcf)(?<!\bvs)\.(?=\s|$)")


def docstring(cls: type) -> str:
    """The class's own docstring, dedented; "" where it has none (not the signature that
    @dataclass writes in its place)."""
    doc = cls.__dict__.get("__doc__") or ""
    if dataclasses.is_dataclass(cls) and doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def first_sentence(text: str) -> str:
    """The first sentence of `text`'s first paragraph, its lines joined; the whole paragraph when
    no full stop ends a sentence in it."""
    paragraph = inspect.cleandoc(text).split("\n\n")[0]
    flat = " ".join(paragraph.split())
    end = _SENTENCE_END.search(flat)
    return flat[: end.end()] if end else flat


def unwrapped(text: str) -> str:
    """`text` with each paragraph's hard-wrapped lines joined, so that a terminal wraps it to its
    own width; a line that starts a list item ("- ", "* ") or is indented keeps its break."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not line.startswith((" ", "- ", "* ")):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def readable_type(tp: Any) -> str:
    """A field's type as a suite writer reads it: int, float | None, token | channel."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin in (Union, types.UnionType):
        return " | ".join(map(readable_type, args))
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else readable_type(a) for a in args)
        return f"{getattr(origin, '__name__', origin)}[{inner}]"
    return getattr(tp, "__name__", str(tp))


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: str  # Python's repr of it, or "required"
    range: str  # what it may be, or UNKNOWN
    meaning: str  # or UNKNOWN


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory's product), or dataclasses.MISSING if required."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def parameters(config: type) -> list[Param]:
    """Every parameter a suite may set on dataclass `config`, in field order."""
    try:
        hints = typing.get_type_hints(config)
    except (NameError, TypeError):  # a plug-in's annotation that does not resolve: shown as text
        hints = {}
    params = []
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        value = field_default(f)
        default = "required" if value is dataclasses.MISSING else repr(value)
        tp = hints.get(f.name, f.type)
        found = declaration(f)
        allowed = found.range_text() if found else ""
        if not allowed and choices(tp) is not None:
            allowed = str(choices(tp))  # as the refusal words it
        params.append(Param(f.name, readable_type(tp), default, allowed or UNKNOWN,
                            found.meaning if found else UNKNOWN))
    return params
