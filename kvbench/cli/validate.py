"""`kvbench validate SUITE`: check a suite without running it."""
from __future__ import annotations

import click

from kvbench.cli.common import (
    console, load_suite_or_exit, overrides_or_exit, say_refused, suite_options,
)


@click.command()
@click.argument("suite_path", metavar="SUITE", type=click.Path(dir_okay=False))
@suite_options
def validate(suite_path, model, model_dtype, device, backend, settings):
    """Check a suite without running it (exit 2 with file:line: key for each problem).

    SUITE is a YAML file, or the name of a suite shipped with kvbench (`kvbench validate
    quick`; `kvbench list suites` names them). It takes `kvbench run`'s --model, --dtype,
    --device, --backend and --set, so a command can be checked before it runs (`kvbench
    validate ruler --model tiny:llama --set ruler.length=2048`); a flag's problem names it."""
    suite = load_suite_or_exit(
        suite_path, overrides_or_exit(model, model_dtype, device, backend, settings))
    say_refused(suite.cases)
    console.print(f"[green]valid:[/] {suite.name}: {len(suite.cases)} case(s)")
