"""`kvbench report RESULTS...`: a report from result files alone, without re-running."""
from __future__ import annotations

import click

from kvbench.cli.common import console, fail, load_results_or_exit


@click.command()
@click.argument("results_paths", metavar="RESULTS...", nargs=-1, required=True,
                type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["md", "json", "html"]), default="md",
              show_default=True,
              help="md or json: one run, to stdout. html: a static results page of one or more "
                   "runs (leaderboards, claims, figures, every case; runs side by side) in --out.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="With --format html: the folder for index.html and each run's files.")
@click.option("--link", is_flag=True,
              help="With --format html: link each run's own folder (its report.md and figures "
                   "already beside its results) instead of copying it next to the page.")
@click.option("--readme", type=click.Path(dir_okay=False),
              help="Inject the tables into this file between kvbench markers.")
@click.option("--section", help="The marker name in --readme: <!-- kvbench:start NAME -->.")
@click.option("--grid", "grids", multiple=True, metavar="BENCHMARK:METRIC",
              help="Instead of the tables: METRIC of BENCHMARK's cases as a grid, a row per "
                   "model and a column per method (refused cases marked, their reasons below); "
                   "repeatable. For a suite that runs its methods on several models.")
@click.option("--benchmark", "benchmarks", multiple=True, metavar="NAME[,NAME...]",
              help="The tables (with --readme, or to stdout): only these benchmarks, in this "
                   "order; repeatable or comma-separated. Default: every benchmark of the run.")
@click.option("--columns", metavar="METRIC[,METRIC...]",
              help="The tables: only these metrics, in this order (each a metric of a chosen "
                   "benchmark). Default: every metric.")
@click.option("--paired", is_flag=True,
              help="The tables: each benchmark's comparisons against identity on the same "
                   "samples below its table, as report.md has them (ruler, niah, perplexity).")
@click.option("--claims", is_flag=True,
              help="The tables: the chosen benchmarks' claims and their verdicts after them.")
@click.option("--all-settings", is_flag=True,
              help="The tables: the line above each names every setting equal in all its rows, "
                   "defaults included (default: only those the suite set, and the model, "
                   "device and seed).")
def report(results_paths, fmt, out_dir, link, readme, section, grids, benchmarks, columns,
           paired, claims, all_settings):
    """Render a report from results.json (or results.jsonl) alone, without re-running.

    `kvbench report reports/*/results.json --format html --out reports/site` makes the results
    page of every committed run; open reports/site/index.html in a browser (`make site` makes
    reports/index.html, linking the runs' folders in place)."""
    if fmt == "html":
        if not out_dir or readme:
            fail("--format html writes a folder: give --out DIR (and no --readme)")
        from kvbench.report.html import build_site

        runs = [(path, load_results_or_exit(path)) for path in results_paths]
        try:
            page = build_site(runs, out_dir, link=link)
        except OSError as exc:
            fail(f"cannot write {out_dir}: {exc}")
        console.print(f"wrote {page} ({len(runs)} run(s))")
        return
    if len(results_paths) > 1 or out_dir or link:
        fail(f"--format {fmt} renders one run to stdout; several runs, or --out, are for "
             "--format html")
    result = load_results_or_exit(results_paths[0])
    if bool(readme) != bool(section):
        fail("--readme and --section go together")
    chosen = bool(benchmarks or columns or paired or claims or all_settings)
    if (grids or chosen) and fmt != "md":
        fail("--grid and the table options render Markdown: leave --format at md")
    if grids and chosen:
        fail("--grid draws its own table: leave out --benchmark, --columns, --paired, --claims "
             "and --all-settings")
    if readme or grids or chosen:
        from kvbench.report.readme import (
            SectionChoice, inject_section, render_grids, render_section,
        )

        choice = SectionChoice(_names(benchmarks), _names([columns] if columns else []),
                               paired, claims, not all_settings)
        try:
            text = render_grids(result, list(grids)) if grids else render_section(result, choice)
            if not readme:
                click.echo(text)
                return
            inject_section(readme, section, text)
        except (ValueError, OSError) as exc:
            fail(str(exc))
        console.print(f"updated section {section!r} in {readme}")
        return
    if fmt == "json":
        click.echo(result.model_dump_json(indent=2))
    else:
        from kvbench.report.markdown import render_markdown

        click.echo(render_markdown(result))


def _names(values) -> tuple[str, ...]:
    """Names given as repeated options, comma-separated, or both, in order, once each."""
    return tuple(dict.fromkeys(name.strip() for value in values for name in value.split(",")
                               if name.strip()))
