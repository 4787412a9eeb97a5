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
@click.option("--cases", "case_ids", metavar="ID[,ID...]",
              help="Replace (or add) only these cases in the existing baseline at --to, the rest"
                   " kept: what the gate prints for the cases a changed setting made not "
                   "comparable.")
def baseline_save(results_path, to_path, allow_errors, case_ids):
    """Copy a finished run's results.json to a baseline file."""
    from kvbench.results import save_results

    result = load_results_or_exit(results_path)
    if case_ids:
        from kvbench.judge.baseline import RefreshRefused, refreshed

        ids = [case_id.strip() for case_id in case_ids.split(",") if case_id.strip()]
        try:
            updated = refreshed(load_results_or_exit(to_path), result, ids)
        except RefreshRefused as exc:
            fail(f"cannot refresh {to_path} from {results_path}: {exc}")
        save_results(to_path, updated)
        console.print(f"refreshed {len(ids)} case(s) of baseline {to_path} from {results_path};"
                      f" {len(updated.cases) - len(ids)} kept")
        return
    if result.interrupted:
        fail(f"{results_path} is from an interrupted run; finish it with --resume first")
    bad = [c.id for c in result.cases if c.status != "ok"]
    if bad and not allow_errors:
        fail(f"{len(bad)} case(s) did not finish ok ({', '.join(bad[:5])}); "
             "fix them or pass --allow-errors")
    save_results(to_path, result)
    console.print(f"saved baseline for suite {result.suite.name!r} "
                  f"(machine {result.machine.get('key')}) to {to_path}")
