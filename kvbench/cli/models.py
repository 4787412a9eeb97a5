"""`kvbench models prepare NAME`: convert a bundled model once and verify it."""
from __future__ import annotations

import click
from rich.markup import escape

from kvbench.cli.common import console, fail


@click.group()
def models():
    """Prepare and inspect models."""


@models.command("prepare")
@click.argument("name")
@click.option("--force", is_flag=True, help="Convert again even if already prepared.")
def models_prepare(name, force):
    """Convert a bundled model (e.g. smollm2-135m) into a local checkpoint once, and verify it."""
    from kvbench.models import BUNDLED, prepare_bundled
    from kvbench.config.registry import did_you_mean

    name = name.removeprefix("bundled:")
    if name not in BUNDLED:
        fail(f"unknown bundled model {name!r}.{did_you_mean(name, BUNDLED)} "
             f"Known: {', '.join(BUNDLED)}")
    path = prepare_bundled(name, force=force, log=lambda m: console.print(escape(m)))
    console.print(f"[green]ready:[/] bundled:{name} at {path}")
