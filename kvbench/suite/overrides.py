"""What a caller changes in a suite as written: keys of its `defaults:` (the command line's
--model, --dtype, --device, --backend, `--set defaults.KEY=VALUE`) and the parameters of its
benchmarks (`--set BENCHMARK.KEY=VALUE`), each refused with the flag that asked for it.

`--set`'s grammar:

- `defaults.KEY=VALUE`: a key of the suite's `defaults:` (`defaults.max_context=131072`).
- `BENCHMARK.KEY=VALUE`: a parameter of every benchmark entry of that kind
  (`ruler.length=32768`); an entry with a matrix axis of that key has that one value on it
  (its case ids keep the axis: `ruler/identity/length=32768`).

VALUE is read as YAML: `32768` an int, `[1, 2]` a list, `{a: b}` a mapping, `true` a boolean.

A suite runs on another model than it was written for when its default model is swapped
(--model): a setting of the suite that this model cannot hold (a length past its context, a
block that does not divide its head_dim, a layer it does not have) then refuses the cases it
makes, recorded with the reason and not run, where it would otherwise fail the suite; a value the
command line set is still refused as an error, naming its flag.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvbench.config.registry import did_you_mean
from kvbench.suite.errors import Issues, Placed, SuiteError, SuiteIssue
from kvbench.suite.schema import Defaults
from kvbench.suite.yaml_lines import load_yaml

DEFAULTS = "defaults"
# what the record of a case refused for a suite setting its model cannot hold says it is
UNFIT = "SettingUnfit"


@dataclass(frozen=True)
class Override:
    """One change: `target` is "defaults" or a benchmark kind; `flag` what the user wrote, for
    the messages ("--set ruler.length=32768", "--model")."""

    flag: str
    target: str
    key: str
    value: Any


class OverrideError(ValueError):
    """A --set that cannot be read; the message names it."""


class FlagIssue(SuiteIssue):
    """A problem of a value the command line gave: named by its flag, not a file and line."""

    def __str__(self) -> str:
        return f"{self.file}: {self.message}" + (f" ({self.hint})" if self.hint else "")


def parse_set(text: str) -> Override:
    """`defaults.KEY=VALUE` or `BENCHMARK.KEY=VALUE`, VALUE read as YAML. A defaults key is
    checked here; a benchmark's kind and key when the suite is read (they depend on it)."""
    flag = f"--set {text}"
    name, equals, raw = text.partition("=")
    target, dot, key = name.strip().rpartition(".")
    if not equals or not dot or not target or not key:
        raise OverrideError(f"{flag}: expected KEY=VALUE, KEY being defaults.NAME or "
                            "BENCHMARK.PARAMETER (e.g. ruler.length=32768)")
    if not raw.strip():
        raise OverrideError(f"{flag}: give a value after '=' (null for none)")
    try:
        value = load_yaml(raw, flag).data
    except SuiteError as exc:
        raise OverrideError(f"{flag}: the value is not YAML: {exc.issues[0].message}") from None
    if target == DEFAULTS and key not in Defaults.model_fields:
        raise OverrideError(f"{flag}: unknown key {key!r};"
                            + _did_you_mean(key, list(Defaults.model_fields)))
    return Override(flag, target, key, value)


def _did_you_mean(name: str, known: list[str]) -> str:
    """" did you mean 'x'?", or the known names when none is close."""
    near = did_you_mean(name, known).replace(" Did", " did", 1)
    return near or f" known: {', '.join(known) or 'none'}"


@dataclass
class Changes:
    """What expansion needs to know of the changes: whether the default model is another than
    the suite's, and which entries' parameters --set changed (by file, entry, key: the flag)."""

    model: bool = False
    flags: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)

    def changed(self, bench: Placed) -> bool:
        """Whether --set changed the parameters of this benchmark entry."""
        return (bench.doc.file, bench.path[-1]) in self.flags

    def flag_at(self, file: str, path: tuple) -> str | None:
        """The flag that set the value at `path` of `file` (benchmarks[i].params.KEY or
        benchmarks[i].matrix.KEY, or below)."""
        if len(path) < 4 or path[0] != "benchmarks" or path[2] not in ("params", "matrix"):
            return None
        return self.flags.get((file, path[1]), {}).get(path[3])

    def same_case(self, bench: Placed, case, earlier) -> bool:
        """Whether `case`, of an entry --set changed, is `earlier` (the case of another entry
        with its id) defined alike: the suite's entries per length become one under --set
        ruler.length=32768. Its claims then join earlier's, and it is not run twice."""
        if earlier is None or not self.changed(bench):
            return False

        def defined(one) -> tuple:
            return one.bench_params, one.method, one.method_params, one.model, one.refused

        if defined(case) != defined(earlier):
            return False
        earlier.claims += [claim for claim in case.claims if claim not in earlier.claims]
        return True

    def unfit(self, swapped: bool, spec: str, doc, path: tuple, message: str,
              issues: Issues) -> str | None:
        """The refusal of the cases a suite setting (at `path` of `doc`) makes, which the model
        `spec` cannot hold: where the model was swapped for the suite's and no flag set the
        value; otherwise None, with the issue added."""
        if swapped and self.flag_at(doc.file, path) is None:
            named = message if spec in message else f"{spec}: {message}"
            return f"{named} (a setting of the suite, written for another model)"
        issues.add(doc, path, message)
        return None


def apply_overrides(files: list, overrides: list[Override], issues: Issues) -> Changes:
    """Set each benchmark override on every entry of its kind in `files` ((doc, SuiteFile), as
    the loader read them), in place; an unknown kind or parameter is an issue naming the flag."""
    from kvbench.benchmarks import BENCHMARKS

    changes = Changes()
    entries = [(doc, i, entry) for doc, suite in files for i, entry in enumerate(suite.benchmarks)]
    kinds = list(dict.fromkeys(entry.kind for _, _, entry in entries))
    for override in overrides:
        if override.target == DEFAULTS:
            continue
        if override.target not in kinds:
            near = did_you_mean(override.target, kinds + [DEFAULTS]).replace(" Did", " did", 1)
            issues.extend([FlagIssue(
                override.flag, 0, "", f"the suite has no benchmark {override.target!r};"
                f"{near} its benchmarks: {', '.join(kinds) or 'none'} (defaults.KEY sets a key"
                " of its defaults)")])
            continue
        try:
            params = BENCHMARKS.get(override.target).Params
            names = [f.name for f in dataclasses.fields(params) if f.init]
        except Exception:  # an unknown or broken kind: the suite's own issue says so
            continue
        if override.key not in names:
            issues.extend([FlagIssue(override.flag, 0, "", f"unknown key {override.key!r};"
                                     + _did_you_mean(override.key, names))])
            continue
        for doc, i, entry in entries:
            if entry.kind != override.target:
                continue
            if override.key in entry.matrix:  # the axis is the one value asked for
                entry.matrix = {**entry.matrix, override.key: [override.value]}
            else:
                entry.params = {**entry.params, override.key: override.value}
            changes.flags.setdefault((doc.file, i), {})[override.key] = override.flag
    return changes


def name_flags(issues: Issues, overrides: list[Override], changes: Changes,
               defaults_file: str) -> None:
    """Each issue about a value a flag gave, named by that flag (in place of `defaults_file`,
    the file name the defaults' overrides are checked under, or the entry's file and line)."""
    flags = {o.key: o.flag for o in overrides if o.target == DEFAULTS}
    for index, issue in enumerate(issues.found):  # rewritten in place: the order is kept
        if isinstance(issue, FlagIssue):
            continue
        key = issue.key.replace("[", ".").replace("]", "").split(".")
        flag = None
        if issue.file == defaults_file and key[0] == DEFAULTS and len(key) > 1:
            flag = flags.get(key[1])
        elif len(key) > 3 and key[0] == "benchmarks" and key[1].isdigit():
            flag = changes.flag_at(issue.file, ("benchmarks", int(key[1]), *key[2:]))
        if flag:
            issues.found[index] = FlagIssue(flag, 0, "", issue.message, issue.hint)
    issues.found[:] = dict.fromkeys(issues.found)  # one flag's value wrong in several entries
