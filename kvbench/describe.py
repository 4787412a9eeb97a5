"""What `kvbench list` says about a method or benchmark, read from the code that defines it.

A description is a docstring's first sentence. A parameter is a field of the method's dataclass
(or of the benchmark's Params): its type and default from the field, its allowed range from what
the class's __post_init__ refuses ("bits must be 2, 4 or 8"), its meaning from the
"name: type = default — meaning" lines of the docstrings of the class and its bases. Nothing is
imported here beyond the standard library: the caller has the classes.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Union

UNKNOWN = "-"  # what the table shows where the code says nothing

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
    range: str  # what __post_init__ accepts, or UNKNOWN
    meaning: str  # or UNKNOWN


def parameters(config: type) -> list[Param]:
    """Every parameter a suite may set on dataclass `config`, in field order."""
    try:
        hints = typing.get_type_hints(config)
    except (NameError, TypeError):  # a plug-in's annotation that does not resolve: shown as text
        hints = {}
    meanings, allowed = field_meanings(config), field_ranges(config)
    params = []
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "required"
        params.append(Param(f.name, readable_type(hints.get(f.name, f.type)), default,
                            allowed.get(f.name, UNKNOWN), meanings.get(f.name, UNKNOWN)))
    return params


# ---- meanings: "name: type = default — meaning" lines of the docstrings ------------------------

_ENTRY = re.compile(r"(?P<indent>\s*)(?P<name>\w+): ")


def field_meanings(config: type) -> dict[str, str]:
    """Each field's meaning from the first docstring along the MRO that describes it (a preset
    without a Parameters section reads its parent's)."""
    names = {f.name for f in dataclasses.fields(config)}
    meanings: dict[str, str] = {}
    for cls in config.__mro__:
        for name, meaning in _entries(docstring(cls)).items():
            if name in names:
                meanings.setdefault(name, meaning)
    return meanings


def _entries(doc: str) -> dict[str, str]:
    """{name: meaning} of the "name: type = default — meaning" entries in `doc`; an entry goes on
    over the lines indented deeper than its first."""
    entries: dict[str, str] = {}
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        start = _ENTRY.match(lines[i])
        i += 1
        if not start:
            continue
        text = [lines[i - 1]]
        indent = len(start["indent"])
        while i < len(lines) and lines[i].strip() and _indent(lines[i]) > indent:
            text.append(lines[i])
            i += 1
        _, dash, meaning = " ".join(" ".join(text).split()).partition("—")
        if dash and meaning.strip():
            entries.setdefault(start["name"], meaning.strip())
    return entries


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


# ---- ranges: the messages of the checks __post_init__ makes ------------------------------------

def field_ranges(config: type) -> dict[str, str]:
    """{field: what it must be}, from the `ValueError("<field> must be <range>, got ...")` that
    `config.__post_init__` raises, directly or through the methods and functions it calls
    (check_at_least(self, {"x": 1}) reads as x: >= 1). Read from the source, never run."""
    fields = {f.name for f in dataclasses.fields(config)}
    post_init = getattr(config, "__post_init__", None)
    if post_init is None:
        return {}
    reader = _CheckReader(config, fields)
    reader.function(post_init, {"self": _SELF}, depth=0)
    return {name: "; ".join(dict.fromkeys(texts)) for name, texts in reader.found.items()}


_SELF = object()  # `self` inside a check: `self.x` in a message reads as x
_RUNTIME = object()  # a value only known when the check runs
_MAX_DEPTH = 6  # calls followed from __post_init__
_MUST_BE = re.compile(r"(?P<name>\w+) must be (?P<range>.*)", re.DOTALL)
# Calls a message or a loop may make to be evaluated here: ones without side effects.
_PURE_BUILTINS = {"sorted", "len", "list", "tuple", "str", "repr", "min", "max", "range"}
_PURE_METHODS = {"join", "items", "keys", "values"}


class _CheckReader:
    """Walks the source of the functions a __post_init__ runs, with the values that are fixed
    in the source (literal loop values, literal arguments, module constants), and keeps what
    each "<field> must be ..." message says."""

    def __init__(self, config: type, fields: set[str]):
        self.config, self.fields = config, fields
        self.found: dict[str, list[str]] = {}
        self.visited: set[tuple] = set()

    def function(self, fn: Any, env: dict[str, Any], depth: int) -> None:
        key = (fn, tuple(sorted((k, repr(v)) for k, v in env.items())))
        if depth > _MAX_DEPTH or key in self.visited:
            return
        self.visited.add(key)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):  # no source (a C function, a made-up class)
            return
        if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.block(tree.body[0].body, fn, dict(env), depth)

    def block(self, stmts: list[ast.stmt], fn: Any, env: dict[str, Any], depth: int) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.For):
                self.calls(stmt.iter, fn, env, depth)
                for item in self.items(self.value(stmt.iter, fn, env)):
                    self.bind(stmt.target, item, env)
                    self.block(stmt.body, fn, env, depth)
                self.block(stmt.orelse, fn, env, depth)
            elif isinstance(stmt, (ast.If, ast.While)):
                self.calls(stmt.test, fn, env, depth)
                self.block(stmt.body, fn, env, depth)
                self.block(stmt.orelse, fn, env, depth)
            elif isinstance(stmt, (ast.With, ast.Try)):
                self.block(stmt.body, fn, env, depth)
                for handler in getattr(stmt, "handlers", []):
                    self.block(handler.body, fn, env, depth)
                self.block(getattr(stmt, "orelse", []), fn, env, depth)
                self.block(getattr(stmt, "finalbody", []), fn, env, depth)
            elif isinstance(stmt, ast.Raise):
                self.message(stmt.exc, fn, env)
            else:
                self.calls(stmt, fn, env, depth)
                for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                    if target is not None:  # an assigned name no longer holds a known value
                        self.bind(target, _RUNTIME, env)

    @staticmethod
    def items(values: Any) -> list[Any]:
        """A loop's values where the source fixes them (a literal tuple, a dict's items, a
        small range); else one pass with a value known at run time."""
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            return [_RUNTIME]
        return list(itertools.islice(values, 64))

    def bind(self, target: ast.expr, value: Any, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, ast.Tuple):
            known = isinstance(value, tuple) and len(value) == len(target.elts)
            for i, element in enumerate(target.elts):
                self.bind(element, value[i] if known else _RUNTIME, env)

    def calls(self, node: ast.AST, fn: Any, env: dict[str, Any], depth: int) -> None:
        """Follows the calls in `node` to methods of the class (self.f, super().f) and to
        functions with source (check_at_least(self, {...}))."""
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            target, callee_env = self.callee(call, fn, env)
            if target is not None:
                self.function(target, callee_env, depth + 1)

    def callee(self, call: ast.Call, fn: Any, env: dict[str, Any]) -> tuple[Any, dict]:
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and env.get(func.value.id) is _SELF:
            method = inspect.getattr_static(self.config, func.attr, None)
            return (method, {"self": _SELF}) if inspect.isfunction(method) else (None, {})
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) \
                and isinstance(func.value.func, ast.Name) and func.value.func.id == "super":
            method = self.after(fn, func.attr)
            return (method, {"self": _SELF}) if method is not None else (None, {})
        if isinstance(func, ast.Name) and func.id not in env:
            helper = fn.__globals__.get(func.id)
            if inspect.isfunction(helper):
                return helper, self.arguments(helper, call, fn, env)
        return None, {}

    def after(self, fn: Any, name: str) -> Any:
        """The function `name` that super() reaches from `fn` (defined in some class of the
        MRO)."""
        mro = self.config.__mro__
        owners = [i for i, cls in enumerate(mro) if cls.__dict__.get(fn.__name__) is fn]
        for cls in mro[owners[0] + 1:] if owners else ():
            method = cls.__dict__.get(name)
            if inspect.isfunction(method):
                return method
        return None

    def arguments(self, helper: Any, call: ast.Call, fn: Any, env: dict[str, Any]) -> dict:
        """The helper's parameters bound to the call's values (_SELF, literals, module
        constants; _RUNTIME for the rest) and its defaults."""
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords):
            return {}

        def argument(node: ast.expr) -> Any:
            if isinstance(node, ast.Name) and env.get(node.id) is _SELF:
                return _SELF  # passed on, so that the helper's `params.x` reads as x
            return self.value(node, fn, env)

        try:
            bound = inspect.signature(helper).bind(
                *map(argument, call.args), **{k.arg: argument(k.value) for k in call.keywords})
        except (TypeError, ValueError):
            return {}
        bound.apply_defaults()
        return dict(bound.arguments)

    def value(self, node: ast.expr, fn: Any, env: dict[str, Any]) -> Any:
        """What `node` evaluates to where that is fixed in the source; _RUNTIME otherwise."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (
                    sub.id in env and (env[sub.id] is _SELF or env[sub.id] is _RUNTIME) or
                    sub.id not in env and sub.id not in fn.__globals__
                    and not hasattr(builtins, sub.id)):
                return _RUNTIME
            if isinstance(sub, ast.Call) and not (
                    isinstance(sub.func, ast.Name) and sub.func.id in _PURE_BUILTINS
                    or isinstance(sub.func, ast.Attribute) and sub.func.attr in _PURE_METHODS):
                return _RUNTIME
            if isinstance(sub, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield)):
                return _RUNTIME
        try:
            return eval(compile(ast.Expression(node), "<check>", "eval"), fn.__globals__, env)
        except Exception:
            return _RUNTIME

    def message(self, exc: ast.expr | None, fn: Any, env: dict[str, Any]) -> None:
        """Keeps the range a `raise ValueError("<field> must be ...")` states."""
        if not (isinstance(exc, ast.Call) and exc.args and isinstance(exc.func, ast.Name)
                and exc.func.id in ("ValueError", "TypeError")):
            return
        text = self.text(exc.args[0], fn, env)
        match = _MUST_BE.match(text or "")
        if not match or match["name"] not in self.fields:
            return
        allowed = match["range"].split(", got")[0].strip().rstrip(".,;:").strip()
        if allowed and "\0" not in allowed:
            # "a multiple of group_size ({self.group_size})" reads "a multiple of group_size"
            allowed = re.sub(r"\b(\w+) \(\1\)", r"\1", allowed)
            self.found.setdefault(match["name"], []).append(allowed)

    def text(self, node: ast.expr, fn: Any, env: dict[str, Any]) -> str | None:
        """A message's text, "\\0" where it holds a value only known at run time."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if not isinstance(node, ast.JoinedStr):
            return None
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
                continue
            expr = part.value
            if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) \
                    and env.get(expr.value.id) is _SELF:
                parts.append(expr.attr)
                continue
            value = self.value(expr, fn, env)
            if value is _RUNTIME or value is _SELF:
                parts.append("\0")
            else:  # a format spec ({x:.2f}) is left out: ranges are written plainly
                convert = {ord("r"): repr, ord("a"): ascii}.get(part.conversion, str)
                parts.append(convert(value))
        return "".join(parts)
