"""What every command shares: the consoles, the exit codes, failing with a message, and loading
a suite or a results file or exiting with what is wrong."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from kvbench.backends.devices import check_device_name

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


SET_HELP = (
    "Change the suite, repeatable: defaults.KEY=VALUE sets a key of its defaults: "
    "(defaults.max_context=131072, 'defaults.chat_template_kwargs={enable_thinking: false}'); "
    "BENCHMARK.KEY=VALUE sets a parameter of every benchmark of that kind (ruler.length=32768,"
    " ruler.samples=20, 'niah.lengths=[4096,8192]'), and where an entry has a matrix axis of "
    "that key the axis is that one value: ruler.length=32768 on entries with matrix "
    "{length: [1024, 4096]} runs length 32768 alone. VALUE is YAML (32768 an int, [1,2] a list,"
    " {a: b} a mapping, true a boolean). An unknown benchmark or key is refused before any "
    "work.")


class DeviceName(click.ParamType):
    """A device as a suite names it (kvbench.backends.devices): its form is checked here,
    whether this machine has it where it is resolved."""

    name = "device"

    def convert(self, value, param, ctx):
        try:
            return check_device_name(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DEVICE = DeviceName()


def suite_options(command):
    """The options that change a suite as read (run and validate take the same ones, so that a
    command can be checked before it runs): --model, --dtype, --device, --backend, --set."""
    options = [
        click.option("--model", metavar="SPEC",
                     help="Run the suite on this model in place of its default one: a hub id "
                          "(Qwen/Qwen3-8B, Org/Name@revision; downloaded on first use), a "
                          "checkpoint folder, bundled:smollm2-135m or tiny:KIND (kvbench list "
                          "models). A claim calibrated on another model is skipped, with the "
                          "reason; a suite setting this model cannot hold (a length past its "
                          "context) refuses its cases, with the reason. Benchmarks that name "
                          "their own model keep it."),
        click.option("--dtype", "model_dtype",
                     type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
                     help="The torch model's weights and activations (the suite's "
                          "model_dtype), e.g. --dtype bfloat16; auto: the checkpoint's own on "
                          "CUDA and MPS, float32 on the CPU."),
        click.option("--device", type=DEVICE, metavar="DEVICE",
                     help="Override the suite's device: auto, cpu, cuda, cuda:N (the N-th CUDA "
                          "device) or mps, e.g. --device cuda:1 (auto: CUDA, else MPS, else the "
                          "CPU). A device this machine lacks is refused before any case runs."),
        click.option("--backend", type=click.Choice(["torch", "mlx"]),
                     help="Override the suite's backend: torch, or mlx (methods on MLX, models "
                          "on mlx-lm; every method and benchmark must support it)."),
        click.option("--set", "settings", metavar="KEY=VALUE", multiple=True, help=SET_HELP),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def overrides_or_exit(model=None, model_dtype=None, device=None, backend=None, settings=()):
    """The suite options as the loader takes them (kvbench.suite.overrides), each named by its
    flag; a --set that cannot be read exits 2 naming it."""
    from kvbench.suite.overrides import DEFAULTS, Override, OverrideError, parse_set

    flags = (("model", "--model", model), ("model_dtype", "--dtype", model_dtype),
             ("device", "--device", device), ("backend", "--backend", backend))
    overrides = [Override(flag, DEFAULTS, key, value) for key, flag, value in flags
                 if value is not None]
    try:
        return overrides + [parse_set(text) for text in settings]
    except OverrideError as exc:
        fail(str(exc))


def load_suite_or_exit(path: str, overrides=(), **defaults):
    """The suite at `path`, a file or the name of a shipped suite (kvbench.suite.locate), with
    the command line's `overrides` (kvbench.suite.overrides)."""
    from kvbench.suite.errors import SuiteError
    from kvbench.suite.loader import load_suite
    from kvbench.suite.locate import SuiteNotFound, locate_suite

    try:
        file = locate_suite(path)
    except SuiteNotFound as exc:
        fail(str(exc))
    try:
        suite = load_suite(file, overrides, **defaults)
    except SuiteError as exc:
        err.print(f"[bold red]invalid suite[/] ({len(exc.issues)} problem(s)):")
        for line in str(exc).splitlines():
            # one issue per line, greppable; printed as is (rich would turn "x.yaml:100:" into
            # an emoji and markup-like text into styles)
            err.print(f"  {line}", soft_wrap=True, markup=False, emoji=False, highlight=False)
        sys.exit(EXIT_INVALID)
    # recorded as typed: `kvbench run quick` is what runs it again (resume, merge, refresh)
    suite.path = str(path)
    return suite


def say_refused(cases) -> None:
    """The cases among `cases` that will not run here, each with why."""
    refused = [case for case in cases if case.refused]
    if refused:
        err.print(f"[yellow]{len(refused)} case(s) refused[/] (recorded as refused, not run):"
                  " their library is not installed here, the method cannot run on the"
                  " model's layers, or the model cannot hold a setting of the suite")
        for case in refused:
            err.print(f"  {case.id}: {case.refused}", soft_wrap=True, markup=False, emoji=False,
                      highlight=False)


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
