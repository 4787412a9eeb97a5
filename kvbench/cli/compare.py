"""`kvbench compare A B`: two runs side by side, or B gated against A."""
from __future__ import annotations

import sys

import click

from kvbench.cli.common import EXIT_BASELINE, EXIT_INVALID, fail, load_results_or_exit
from kvbench.cli.verdicts import exit_causes, exit_code, refresh_command


@click.command()
@click.argument("a_path", metavar="A", type=click.Path(dir_okay=False))
@click.argument("b_path", metavar="B", type=click.Path(dir_okay=False))
@click.option("--gate", "as_gate", is_flag=True,
              help="A is the baseline: exit as `kvbench run B's suite --baseline A` did for B, "
                   "with the same findings (1 a failed claim or a regression, 3 a crashed case, "
                   "4 not comparable). Needs no torch: a CI job can gate a run made elsewhere.")
@click.option("--strict", is_flag=True,
              help="With --gate: a case that A defines otherwise (another setting) exits 4, as "
                   "`run --baseline --strict` does; without it such a case is marked not "
                   "comparable and the rest are gated.")
def compare(a_path, b_path, as_gate, strict):
    """Side by side: A, B, ratio B/A, a mark (better, worse, ~ not significant, x not
    comparable) and the rule that judged each row, with the stricter of the two suites' gate
    settings."""
    from kvbench.judge.gate import gate
    from kvbench.report.compare import render_compare

    if strict and not as_gate:
        fail("--strict is for --gate")
    code = EXIT_BASELINE if as_gate else EXIT_INVALID  # a broken baseline is a gate's exit 4
    a, b = load_results_or_exit(a_path, code), load_results_or_exit(b_path)
    # As a gate, a case A has and B lacks is lost unless B's run was a subset (as run judged
    # it); side by side it is only marked x.
    report = gate(b, a, strict=strict) if as_gate else gate(b, a, expect_all=False)
    click.echo(render_compare(a, b, report))
    if as_gate:
        code = exit_code(b, report)
        causes = exit_causes(b, report)
        if causes:
            click.echo(f"gate: exit {code}" + (", because:" if code else "; found:"), err=True)
            for cause in causes:
                click.echo(f"  {cause}", err=True)
        refresh = refresh_command(report, b_path, a_path)
        if refresh:
            click.echo(f"to gate them from now on, make B their baseline:\n  {refresh}",
                       err=True)
        sys.exit(code)
