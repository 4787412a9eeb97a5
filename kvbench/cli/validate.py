"""`kvbench validate SUITE`: check a suite without running it."""
from __future__ import annotations

import click

from kvbench.cli.common import console, load_suite_or_exit


@click.command()
@click.argument("suite_path", metavar="SUITE", type=click.Path(dir_okay=False))
def validate(suite_path):
    """Check a suite without running it (exit 2 with file:line: key for each problem).

    SUITE is a YAML file, or the name of a suite shipped with kvbench (`kvbench validate
    quick`; `kvbench list suites` names them)."""
    suite = load_suite_or_exit(suite_path)
    console.print(f"[green]valid:[/] {suite.name}: {len(suite.cases)} case(s)")
