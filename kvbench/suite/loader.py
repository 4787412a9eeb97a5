"""load_suite: a YAML file (and its includes) -> a validated LoadedSuite, or a SuiteError that
names every problem with its file, line and key.

Two passes: first each file's shape (YAML syntax, keys, types), then, when every file is well
formed, what needs the registries and models (names, parameters and their ranges, claims,
selectors, models). Neither needs torch: methods and benchmarks are checked against their
declarations (kvbench.methods.settings, kvbench.benchmarks.specs).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvbench.suite.case import LoadedSuite
from kvbench.judge.tolerance import DEFAULT_TOLERANCE, Tolerance
from kvbench.suite.errors import Issues, Placed, SuiteError, SuiteIssue
from kvbench.suite.expand import expand_cases
from kvbench.suite.locate import SuiteNotFound, locate_include
from kvbench.suite.names import check_gate_metrics
from kvbench.suite.overrides import DEFAULTS, Override, apply_overrides, name_flags
from kvbench.suite.schema import (
    LATER_SETTINGS,
    SCHEMA_VERSION,
    Defaults,
    SuiteFile,
    ToleranceSpec,
    schema_issues,
)
from kvbench.suite.yaml_lines import YamlDoc, load_yaml

OVERRIDES = "(overrides)"  # the file the caller's defaults are checked under


def load_suite(path: str | os.PathLike, overrides: Sequence[Override] = (),
               **defaults: Any) -> LoadedSuite:
    """Load and check a suite; keyword arguments override its `defaults:` (device="cpu", ...),
    and `overrides` are the command line's (kvbench.suite.overrides: --model, --set, ...),
    each problem of theirs named by its flag."""
    shown = str(path)
    if not Path(shown).is_file():
        raise SuiteError([SuiteIssue(shown, 1, "", "no such suite file")])
    issues = Issues()
    files: list[tuple[YamlDoc, SuiteFile]] = []
    _read(shown, issues, [], set(), files)
    issues.raise_if_any()
    overrides = list(overrides)
    changes = apply_overrides(files, overrides, issues)
    defaults = {**defaults, **{o.key: o.value for o in overrides if o.target == DEFAULTS}}
    changes.model = defaults.get("model") is not None

    top_doc, top = files[-1]
    methods = [Placed(m, doc, ("methods", i)) for doc, f in files for i, m in enumerate(f.methods)]
    benchmarks = [Placed(b, doc, ("benchmarks", i))
                  for doc, f in files for i, b in enumerate(f.benchmarks)]
    for key, entries in (("methods", methods), ("benchmarks", benchmarks)):
        if not entries:
            issues.add(top_doc, (key,), f"the suite has no {key}",
                       "list at least one, here or in an included file")
    settings, default_model = _merge_defaults(files, defaults, issues)
    default_tol, tolerances, gate_names, absolute_timings = _merge_gate(files)
    check_gate_metrics(gate_names, benchmarks, issues)
    cases = expand_cases(methods, benchmarks, settings, default_model, issues, changes)
    name_flags(issues, overrides, changes, OVERRIDES)
    issues.raise_if_any()

    defaults_written = settings.model_dump()
    for key in LATER_SETTINGS:
        if defaults_written[key] == Defaults.model_fields[key].get_default(
                call_default_factory=True):
            del defaults_written[key]
    resolved = {
        "kvbench": SCHEMA_VERSION,
        "name": top.name or Path(shown).stem,
        "description": top.description,
        "defaults": defaults_written,
        "gate": {"default": default_tol.model_dump(),
                 "metrics": {k: v.model_dump() for k, v in tolerances.items()},
                 "absolute_timings": absolute_timings},
        "methods": [m.value.model_dump() for m in methods],
        "benchmarks": [b.value.model_dump() for b in benchmarks],
    }
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return LoadedSuite(
        name=resolved["name"],
        path=shown,
        hash=hashlib.sha256(canonical.encode()).hexdigest(),
        resolved=resolved,
        cases=cases,
        tolerances={k: Tolerance(v.abs, v.rel) for k, v in tolerances.items()},
        default_tolerance=Tolerance(default_tol.abs, default_tol.rel),
    )


def _read(file: str, issues: Issues, stack: list[str], done: set[Path], out: list) -> None:
    """Append (doc, SuiteFile) for `file`, after those of its includes (depth first, each once)."""
    done.add(Path(file).resolve())
    try:
        doc = load_yaml(Path(file).read_text(encoding="utf-8"), file)
    except SuiteError as exc:
        issues.extend(exc.issues)
        return
    except (OSError, UnicodeDecodeError) as exc:
        issues.extend([SuiteIssue(file, 1, "", f"cannot read the file: {exc}")])
        return
    if doc.data is None:
        issues.add(doc, (), "the file is empty", f"a suite starts with `kvbench: {SCHEMA_VERSION}`")
        return
    try:
        suite = SuiteFile.model_validate(doc.data)
    except ValidationError as exc:
        for path, message, hint in schema_issues(exc, doc.data):
            issues.add(doc, path, message, hint)
        return
    for i, name in enumerate(suite.include):
        try:
            target = locate_include(file, name)
        except SuiteNotFound as exc:
            issues.add(doc, ("include", i), str(exc))
            continue
        chain = [Path(f).resolve() for f in stack + [file]]
        if Path(target).resolve() in chain:
            cycle = [*stack, file][chain.index(Path(target).resolve()):] + [target]
            issues.add(doc, ("include", i), f"include cycle: {' -> '.join(cycle)}")
        elif Path(target).resolve() not in done:
            _read(target, issues, stack + [file], done, out)
    out.append((doc, suite))


def _merge_defaults(files, overrides: dict[str, Any], issues: Issues):
    """Defaults key by key, later files winning, then the caller's overrides; and where the
    default model was written (relative checkpoint paths are relative to that file)."""
    merged: dict[str, Any] = {}
    model: Placed[str] | None = None
    for doc, suite in files:
        written = suite.defaults.model_dump(exclude_unset=True)
        merged.update(written)
        if "model" in written:
            model = written["model"] and Placed(written["model"], doc, ("defaults", "model"))
    if overrides:
        # An override model path is relative to the working directory, as on a command line.
        doc = YamlDoc(OVERRIDES, overrides)
        merged.update(overrides)
        if "model" in overrides:
            model = overrides["model"] and Placed(overrides["model"], doc, ("defaults", "model"))
    try:
        return Defaults.model_validate(merged), model
    except ValidationError as exc:
        for path, message, hint in schema_issues(exc, merged):
            issues.add(YamlDoc(OVERRIDES, overrides), ("defaults", *path), message, hint)
        return Defaults(), model


def _merge_gate(files):
    """(default tolerance, per-metric tolerances, where each metric was named, whether absolute
    timings are gated); a later file's setting wins."""
    default = ToleranceSpec(abs=DEFAULT_TOLERANCE.abs, rel=DEFAULT_TOLERANCE.rel)
    tolerances: dict[str, ToleranceSpec] = {}
    names: dict[str, Placed[str]] = {}
    absolute_timings = False
    for doc, suite in files:
        default = suite.gate.default or default
        if "absolute_timings" in suite.gate.model_fields_set:
            absolute_timings = suite.gate.absolute_timings
        for metric, tolerance in suite.gate.metrics.items():
            tolerances[metric] = tolerance
            names[metric] = Placed(metric, doc, ("gate", "metrics", metric))
    return default, tolerances, list(names.values()), absolute_timings


def suite_descriptions(folder: Path) -> list[tuple[Path, str]]:
    """(path, description) of every suite file under `folder`, in path order; a description is
    the suite's summary: all of it, its lines joined."""
    out = []
    for path in sorted(folder.rglob("*.yaml")):
        try:
            description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except yaml.YAMLError:
            description = "(not valid YAML)"
        out.append((path, " ".join(str(description or "").split())))
    return out
