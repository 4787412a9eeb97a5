"""Where a SUITE argument points: a YAML file as given, or a suite shipped with kvbench, by its
name (`quick`, `seeds/turboquant`).

The shipped suites are the checkout's suites/ folder, which the package holds as
kvbench/suites (a link in the checkout, copied into the wheel as package data), so an
installed kvbench finds the same files as the checkout. An existing file always wins: a path
works as it always did.
"""
from __future__ import annotations

import difflib
import importlib.resources
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
