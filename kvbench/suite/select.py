"""The command line's case selection (--methods, --only, --limit) over a loaded suite."""
from __future__ import annotations

import fnmatch

from kvbench.config.registry import did_you_mean
from kvbench.suite.case import Case, LoadedSuite


class SelectionError(ValueError):
    """The selection leaves no case; the message says what there is."""


def method_matches(case: Case, pattern: str) -> bool:
    """--methods' one test, for the check and the filter alike: the label or the method's
    name matches the glob."""
    return (fnmatch.fnmatchcase(case.method_label, pattern)
            or fnmatch.fnmatchcase(case.method, pattern))


def select_cases(suite: LoadedSuite, only: str | None, methods: str | None,
                 limit: int | None) -> list[Case]:
    """The cases to run; SelectionError when the selection leaves none."""
    cases = suite.cases
    if not cases:
        raise SelectionError(f"{suite.path} expands to no case (its benchmarks' `methods:`"
                             " select none)")
    if methods:
        wanted = [m.strip() for m in methods.split(",") if m.strip()]
        names = sorted({c.method_label for c in cases} | {c.method for c in cases})
        for pattern in wanted:
            if not any(method_matches(c, pattern) for c in cases):
                raise SelectionError(
                    f"--methods: {pattern!r} matches no method label or name in {suite.path}."
                    f"{did_you_mean(pattern, names)} Available: {', '.join(names)}")
        cases = [c for c in cases if any(method_matches(c, w) for w in wanted)]
    if only:
        pattern = only if any(ch in only for ch in "*?[") else f"*{only}*"
        chosen = [c for c in cases if fnmatch.fnmatchcase(c.id, pattern)]
        if not chosen:
            among = " among the --methods selection" if methods else ""
            shown = ", ".join(c.id for c in cases[:12]) + (", ..." if len(cases) > 12 else "")
            raise SelectionError(f"--only {only!r} matches no case{among}. Case ids: {shown}"
                                 f" (all of them: `kvbench run {suite.path} --dry-run`)")
        cases = chosen
    if limit is not None:
        cases = cases[:limit]
    return cases
