"""A suite entry's parameters and matrix: every combination, each validated into its settings
class, and where a refusal belongs (the matrix value or the params key that set the field the
settings blame, kvbench.config.fields.SettingError)."""
from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kvbench.config.fields import LibraryMissing, SettingError, each_error, field_errors
from kvbench.config.registry import did_you_mean
from kvbench.config.strict import validate
from kvbench.suite.errors import Issues, Placed
from kvbench.suite.schema import explain_error


@dataclass
class Unavailable:
    """A combination whose settings need a library not installed here (LibraryMissing): its
    cases are refused with `reason`, the suite's others run."""

    params: dict[str, Any]
    reason: str


def settings_of(cls: type, placed: Placed, what: str, issues: Issues
                ) -> list[Any | Unavailable | None]:
    """One validated `cls` instance (None where invalid, Unavailable where its library is
    missing) per combination of the entry's matrix."""
    params, matrix = placed.value.params, placed.value.matrix
    combos = matrix_combos(matrix)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    ok = True
    for section, keys in (("params", params), ("matrix", matrix)):
        for key in keys:
            problem, hint = "", ""
            if key not in names:
                problem = f"unknown parameter {key!r} of {what}"
                hint = (did_you_mean(key, names).strip()
                        or f"parameters: {', '.join(names) or 'none'}")
            elif section == "matrix" and key in params:
                problem = f"{key!r} is set in both params and matrix"
            elif section == "matrix" and not matrix[key]:
                problem = "the matrix lists no values"
            if problem:
                issues.add(placed.doc, placed.at(section, key), problem, hint)
                ok = False
    if not ok:
        return [None] * len(combos)
    out = []
    for combo in combos:
        try:
            out.append(validate(cls, {**params, **combo}))
        except ValidationError as exc:
            missing = _library_missing(exc)
            if missing is not None:
                out.append(Unavailable({**params, **combo}, str(missing)))
                continue
            out.append(None)
            for refused in _errors_beside(cls, {**params, **combo}, exc):
                _refused(refused, combo, placed, issues)
            for err in exc.errors():
                refused = err.get("ctx", {}).get("error")
                if not err["loc"] and isinstance(refused, Exception):
                    _refused(refused, combo, placed, issues)  # the settings' own checks
                    continue
                path = param_path(err["loc"], combo, placed)
                issues.add(placed.doc, path, explain_error(err, path)[0])
        except LibraryMissing as exc:  # raised outside pydantic's validation
            out.append(Unavailable({**params, **combo}, str(exc)))
        except (TypeError, ValueError) as exc:
            out.append(None)
            _refused(exc, combo, placed, issues)
    return out


def _library_missing(exc: ValidationError) -> LibraryMissing | None:
    """The settings' own LibraryMissing, where that is their only error."""
    errors = exc.errors()
    refused = errors[0].get("ctx", {}).get("error") if len(errors) == 1 else None
    return refused if isinstance(refused, LibraryMissing) and not errors[0]["loc"] else None


def _refused(exc: Exception, combo: dict, placed: Placed, issues: Issues) -> None:
    """Each value the settings refused, at the field it names."""
    for one in each_error(exc):
        fields = one.fields if isinstance(one, SettingError) else ()
        issues.add(placed.doc, blame(fields, combo, placed), str(one))


def _errors_beside(cls: type, params: dict[str, Any], exc: ValidationError
                   ) -> list[SettingError]:
    """The range errors of the parameters a first pass did not get to: values of the wrong YAML
    type are refused before any range is checked, so the others are checked alone (every error
    of a block is reported at once, not one a round)."""
    wrong = {err["loc"][0] for err in exc.errors() if err["loc"]}
    if not wrong:
        return []
    return field_errors(cls, {k: v for k, v in params.items() if k not in wrong})


def param_path(loc: tuple, combo: dict, placed: Placed) -> tuple:
    """Where a field error belongs: the matrix value that set the field, else params."""
    if loc and loc[0] in combo:
        return placed.at("matrix", loc[0], index_of(placed.value.matrix[loc[0]], combo[loc[0]]),
                         *loc[1:])
    return placed.at("params", *loc)


def blame(fields: tuple[str, ...], combo: dict, placed: Placed) -> tuple:
    """Where a refusal naming `fields` (kvbench.config.fields.SettingError) belongs: the first of
    them that the matrix sets, else that params sets, else the entry's params (or matrix)."""
    for key in fields:
        if key in combo:
            return placed.at("matrix", key, index_of(placed.value.matrix[key], combo[key]))
    for key in fields:
        if key in placed.value.params:
            return placed.at("params", key)
    if placed.value.params or not combo:
        return placed.at("params")
    return placed.at("matrix")


def index_of(values: list, value: Any) -> int:
    return next(i for i, v in enumerate(values) if v is value)


def matrix_combos(matrix: dict[str, list]) -> list[dict[str, Any]]:
    """The cartesian product of a matrix, in the order written ([{}] for no matrix)."""
    return [dict(zip(matrix, values, strict=True))
            for values in itertools.product(*matrix.values())]


def value_text(value: Any) -> str:
    """A matrix value as it appears in labels and case ids: 4, 0.5, gaussian, true, [0,1]."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, separators=(",", ":"), default=str)  # YAML dates are not JSON
