"""Where a SUITE argument points: a YAML file as given, or a suite shipped with kvbench, by its
name (`quick`, `seeds/turboquant`).

The shipped suites are the checkout's suites/ folder, which the package holds as
kvbench/suites (a link in the checkout, copied into the wheel as package data), so an
installed kvbench finds the same files as the checkout. An existing file always wins: a path
works as it always did. A suite's `include:` finds files the same way (locate_include).
"""
from __future__ import annotations

import difflib
import importlib.resources
import os
from pathlib import Path

SUFFIXES = (".yaml", ".yml")


class SuiteNotFound(LookupError):
    """A SUITE argument that is neither a file nor the name of a shipped suite."""


def shipped_folder() -> Path:
    """The folder of the shipped suites (resolved: in the checkout, the suites/ one edits)."""
    # files() of a plain folder install is a real path; the loader needs one for includes
    return Path(str(importlib.resources.files("kvbench") / "suites")).resolve()


def shipped_suites() -> dict[str, Path]:
    """Name (its path under the folder, without .yaml) -> file, of every shipped suite."""
    folder = shipped_folder()
    if not folder.is_dir():
        return {}
    found = {path.relative_to(folder).with_suffix("").as_posix(): path
             for path in folder.rglob("*.yaml")}
    return dict(sorted(found.items()))


def locate_suite(argument: str) -> str:
    """The file to read for `argument`: itself when it is a file or names a YAML file (the
    loader then says if it is missing), else the shipped suite of that name. A missing name
    raises SuiteNotFound naming the shipped suites and the nearest ones."""
    if Path(argument).is_file():
        return argument
    shipped = shipped_suites()
    if argument.endswith(SUFFIXES):
        # a path that is not here: say so when kvbench ships a suite of that name
        parts = Path(argument).with_suffix("").parts
        named = [name for name in shipped
                 if list(parts[-len(name.split("/")):]) == name.split("/")]
        if named:
            best = max(named, key=len)
            raise SuiteNotFound(f"no such suite file: {argument}; kvbench ships a suite of that "
                                f"name: `{best}` (e.g. `kvbench run {best}`)")
        return argument
    if argument in shipped:
        return str(shipped[argument])
    near = difflib.get_close_matches(argument, list(shipped), n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise SuiteNotFound(
        f"no suite file or shipped suite named {argument!r}{hint}; the shipped suites: "
        f"{', '.join(shipped) or 'none (this install holds no kvbench/suites folder)'}. "
        "A suite of your own is given by its path (e.g. my_suite.yaml); "
        "`kvbench list suites` describes the shipped ones")


def locate_include(including: str, name: str) -> str:
    """The file an `include:` of the suite file `including` names: the path relative to that
    file when it exists, else the shipped suite of that name (`include: [ruler]`,
    `include: [seeds/turboquant]`). SuiteNotFound names both tries and the shipped suites."""
    target = os.path.normpath(os.path.join(os.path.dirname(including), name))
    if Path(target).is_file():
        return target
    shipped = shipped_suites()
    if name in shipped:
        return str(shipped[name])
    stem = name[: -len(Path(name).suffix)] if name.endswith(SUFFIXES) else None
    if stem in shipped:
        hint = f"kvbench ships a suite of that name: include: [{stem}]"
    else:
        near = difflib.get_close_matches(name, list(shipped), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        hint += f"the shipped suites: {', '.join(shipped) or 'none'}"
    raise SuiteNotFound(f"no such file: {target}, nor a shipped suite named {name!r} (an "
                        f"include is a path relative to the including file, or the name of a "
                        f"shipped suite; {hint})")
