"""`kvbench compare A B`: two runs side by side, or B gated against A."""
from __future__ import annotations

import sys

import click

from kvbench.cli.common import EXIT_BASELINE, EXIT_INVALID, load_results_or_exit
from kvbench.cli.verdicts import exit_causes, exit_code


@click.command()
@click.argument("a_path", metavar="A", type=click.Path(dir_okay=False))
@click.argument("b_path", metavar="B", type=click.Path(dir_okay=False))
@click.option("--gate", "as_gate", is_flag=True,
              help="A is the baseline: exit as `kvbench run --baseline` would for B (1 a failed "
                   "claim or a regression, 3 a crashed case, 4 not comparable). Needs no torch: "
                   "a CI job can gate a run made elsewhere.")
def compare(a_path, b_path, as_gate):
    """Side by side: A, B, ratio B/A, a mark (better, worse, ~ not significant, x not
    comparable) and the rule that judged each row, with the stricter of the two suites' gate
    settings."""
    from kvbench.judge.gate import gate
    from kvbench.report.compare import render_compare

    code = EXIT_BASELINE if as_gate else EXIT_INVALID  # a broken baseline is a gate's exit 4
    a, b = load_results_or_exit(a_path, code), load_results_or_exit(b_path)
    # As a gate, a case A has and B lacks counts as lost; side by side it is only marked x.
    report = gate(b, a, expect_all=as_gate)
    click.echo(render_compare(a, b, report))
    if as_gate:
        code = exit_code(b, report)
        if code:
            click.echo(f"gate: exit {code}, because:", err=True)
            for cause in exit_causes(b, report):
                click.echo(f"  {cause}", err=True)
        sys.exit(code)
