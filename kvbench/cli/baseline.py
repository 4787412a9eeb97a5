"""`kvbench baseline save RESULTS --to PATH`: store a finished run as a baseline."""
from __future__ import annotations

import click

from kvbench.cli.common import console, fail, load_results_or_exit


@click.group()
def baseline():
    """Store results as a baseline that later runs are gated against."""


@baseline.command("save")
@click.argument("results_path", metavar="RESULTS", type=click.Path(dir_okay=False))
@click.option("--to", "to_path", required=True, type=click.Path(dir_okay=False),
              help="Where to store it, e.g. baselines/quick.linux-x86_64-cpu.json")
@click.option("--allow-errors", is_flag=True, help="Store it even if some cases crashed.")
def baseline_save(results_path, to_path, allow_errors):
    """Copy a finished run's results.json to a baseline file."""
    from kvbench.results import save_results

    result = load_results_or_exit(results_path)
    if result.interrupted:
        fail(f"{results_path} is from an interrupted run; finish it with --resume first")
    bad = [c.id for c in result.cases if c.status != "ok"]
    if bad and not allow_errors:
        fail(f"{len(bad)} case(s) did not finish ok ({', '.join(bad[:5])}); "
             "fix them or pass --allow-errors")
    save_results(to_path, result)
    console.print(f"saved baseline for suite {result.suite.name!r} "
                  f"(machine {result.machine.get('key')}) to {to_path}")
