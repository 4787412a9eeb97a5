"""kvbench's command line: one module per command, each thin (parse, call the library,
render with rich); this one makes the group."""
import click

from kvbench.cli.baseline import baseline
from kvbench.cli.compare import compare
from kvbench.cli.env import env
from kvbench.cli.listing import list_
from kvbench.cli.merge import merge
from kvbench.cli.models import models
from kvbench.cli.report import report
from kvbench.cli.run import run
from kvbench.cli.schema import schema
from kvbench.cli.serve import serve
from kvbench.cli.validate import validate
from kvbench.hardware import KVBENCH_VERSION


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(KVBENCH_VERSION, prog_name="kvbench")
def main():
    """Benchmark and validate KV-cache compression methods.

    Suites are YAML files (see `kvbench schema`); `kvbench run SUITE` runs one and writes
    results.json, results.jsonl and report.md. Exit codes: 0 all claims hold and no regression,
    1 a claim failed or a regression, 2 invalid suite or command, 3 a case crashed,
    4 baseline missing or not comparable, 130 interrupted (Ctrl-C or SIGTERM: the finished
    cases are kept, and the command that resumes the run is printed).
    """


for command in (run, validate, list_, env, schema, report, compare, merge, baseline, serve, models):
    main.add_command(command)
