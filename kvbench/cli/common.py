"""What every command shares: the consoles, the exit codes, failing with a message, and loading
a suite or a results file or exiting with what is wrong."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

from rich.console import Console, ConsoleDimensions
from rich.markup import escape

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_CRASHED, EXIT_BASELINE = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130

# Columns when the output is not a terminal: wide enough that nothing wraps.
UNWRAPPED = 10_000


class LogConsole(Console):
    """rich's Console, except that output to a pipe or a file is not wrapped: rich assumes 80
    columns there, and logs split case ids mid-word and tables one word per line. COLUMNS, when
    set, still decides."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if "COLUMNS" in os.environ or _is_tty(self.file):
            return size
        return ConsoleDimensions(UNWRAPPED, size.height)

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed (at the end of a test run)
        return False


console = LogConsole(emoji=False)  # ids like tiny:llama: are text, not :emoji: codes
err = LogConsole(stderr=True, emoji=False)


def fail(message: str, code: int = EXIT_INVALID) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    sys.exit(code)


def load_suite_or_exit(path: str, **defaults):
    """The suite at `path`, a file or the name of a shipped suite (kvbench.suite.locate)."""
    from kvbench.suite.errors import SuiteError
    from kvbench.suite.loader import load_suite
    from kvbench.suite.locate import SuiteNotFound, locate_suite

    try:
        file = locate_suite(path)
    except SuiteNotFound as exc:
        fail(str(exc))
    try:
        suite = load_suite(file, **defaults)
    except SuiteError as exc:
        err.print(f"[bold red]invalid suite[/] ({len(exc.issues)} problem(s)):")
        for line in str(exc).splitlines():
            # one issue per line, greppable; printed as is (rich would turn "x.yaml:100:" into
            # an emoji and markup-like text into styles)
            err.print(f"  {line}", soft_wrap=True, markup=False, emoji=False, highlight=False)
        sys.exit(EXIT_INVALID)
    # recorded as typed: `kvbench run quick` is what runs it again (resume, merge, refresh)
    suite.path = str(path)
    refused = [case for case in suite.cases if case.refused]
    if refused:
        err.print(f"[yellow]{len(refused)} case(s) refused[/] (recorded as refused, not run):"
                  " their library is not installed here, or the method cannot run on the"
                  " model's layers")
        for case in refused:
            err.print(f"  {case.id}: {case.refused}", soft_wrap=True, markup=False, emoji=False,
                      highlight=False)
    return suite


def load_results_or_exit(path: str, code: int = EXIT_INVALID):
    from kvbench.results import ResultsFileError, load_results

    if not Path(path).exists():
        fail(f"{path} does not exist", code)
    try:
        return load_results(path)
    except ResultsFileError as exc:  # names the file and the fault
        fail(str(exc), code)
    except OSError as exc:
        fail(f"cannot read {path}: {exc}", code)
