"""`kvbench merge RUN... --out DIR`: the shards and parts of one suite's run joined into one."""
from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from kvbench.cli.common import EXIT_CRASHED, console, err, fail, load_results_or_exit
from kvbench.cli.verdicts import exit_code, summary


@click.command()
@click.argument("inputs", metavar="RUN...", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the merged results.json, results.jsonl and report.md.")
@click.option("--allow-mixed", is_flag=True,
              help="Join runs made on different machines or at different commits (each case "
                   "keeps its machine key in info.machine and its commit in info.git_sha).")
def merge(inputs, out_dir, allow_mixed):
    """Join the shards and parts of one suite's run into one.

    Each RUN is an output folder or its results.json (an interrupted run's results.jsonl also
    works): a shard (`kvbench run SUITE --shard I/N`), or a whole run of a part of the suite
    (`--only`, or shards merged before). Runs that planned the same cases are the shards of one
    part; parts plan different cases. A suite longer than a session runs a part a session, each
    merged here with the others. Refused (exit 2): runs of different suites, kvbench versions,
    commits, settings or machines (see --allow-mixed), parts whose cases overlap, and a case in
    two runs. Shards or cases that are missing are listed and the rest is merged (exit 3);
    `kvbench run SUITE --out DIR --resume` then runs only what is missing. Otherwise it exits as
    `kvbench run` would for the merged run's claims. Needs no torch.
    """
    from kvbench.report.markdown import write_reports
    from kvbench.run.files import JSON, JSONL
    from kvbench.run.merge import MergeRefused, merge_runs, write_merged

    out = Path(out_dir)
    runs = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            if out.resolve() == path.resolve():
                fail(f"--out {out_dir} is one of the runs to merge; give another folder")
            found = [path / name for name in (JSON, JSONL) if (path / name).exists()]
            path = found[0] if found else path / JSON
        runs.append((str(path), load_results_or_exit(str(path))))
    try:
        merged = merge_runs(runs, allow_mixed=allow_mixed)
    except MergeRefused as exc:
        fail(str(exc))
    result = merged.result
    try:
        write_merged(result, [Path(path).parent for path, _ in runs], out)
        write_reports(result, out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc}", EXIT_CRASHED)
    console.print(f"merged {len(runs)} run(s) of suite {result.suite.name!r}: "
                  f"{len(result.cases)} case(s) on {', '.join(merged.machines)}")
    summary(result, None, out)
    if not merged.complete:
        if merged.missing_shards:
            err.print(f"[red]missing shard(s):[/] {', '.join(merged.missing_shards)}")
        shown = ", ".join(merged.missing_cases[:10])
        more = ", ..." if len(merged.missing_cases) > 10 else ""
        err.print(f"[red]{len(merged.missing_cases)} planned case(s) in no run:[/] "
                  f"{escape(shown)}{more}\n  run them with: kvbench run {result.suite.path} "
                  f"--out {out} --resume", soft_wrap=True)
        sys.exit(EXIT_CRASHED)
    sys.exit(exit_code(result, None))
