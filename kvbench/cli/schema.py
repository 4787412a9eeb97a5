"""`kvbench schema`: the suite file's JSON schema."""
from __future__ import annotations

import json

import click


@click.command()
def schema():
    """Print the suite file JSON schema."""
    from kvbench.suite.schema import suite_json_schema

    click.echo(json.dumps(suite_json_schema(), indent=2, sort_keys=True))
