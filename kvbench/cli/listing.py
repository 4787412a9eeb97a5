"""`kvbench list methods|benchmarks|models|suites [NAME]`: what there is, and what one is."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import console, fail


@click.command("list")
@click.argument("what", type=click.Choice(["methods", "benchmarks", "models", "suites"]))
@click.argument("name", required=False)
def list_(what, name):
    """List registered methods, benchmarks, bundled models, or suites: those shipped with
    kvbench, by the name that runs one (`kvbench run quick`), and those under ./suites when it
    is another folder, by their path.

    Each method and benchmark is shown with its parameters and the first sentence of its
    docstring.

    `kvbench list methods NAME` and `kvbench list benchmarks NAME` show one of them: its whole
    docstring and every parameter with its type, default, allowed range and meaning (a "-"
    where the code states none); a benchmark also every metric it reports, with its unit,
    which way is better, whether it is a timing, and its exact definition. An unknown NAME
    exits 2 with the nearest names."""
    if name is not None:
        if what not in ("methods", "benchmarks"):
            fail("a NAME is taken only by `kvbench list methods NAME` and"
                  " `kvbench list benchmarks NAME`")
        (_show_method if what == "methods" else _show_benchmark)(name)
        return
    from kvbench.config import describe

    table = Table()
    if what in ("methods", "benchmarks"):
        from kvbench.benchmarks import BENCHMARKS
        from kvbench.methods import METHODS

        registry = METHODS if what == "methods" else BENCHMARKS
        table.add_column(what[:-1])
        table.add_column("parameters")
        table.add_column("description")
        for name in registry.names():
            cls = registry.get(name)
            config = cls if what == "methods" else cls.Params
            params = ", ".join(p.name if p.default == "required" else f"{p.name}={p.default}"
                               for p in describe.parameters(config))
            table.add_row(name, escape(params),
                          escape(describe.first_sentence(describe.docstring(cls))))
    elif what == "models":
        from kvbench.models import BUNDLED, kvbench_home

        table.add_column("model")
        table.add_column("prepared")
        table.add_column("notes")
        for name, meta in BUNDLED.items():
            prepared = (kvbench_home() / "models" / name / "kvbench.json").exists()
            table.add_row(f"bundled:{name}", "yes" if prepared else "no",
                          escape(meta.description))
        from kvbench.models.tiny_configs import TINY_CONFIGS

        for name, config in TINY_CONFIGS.items():
            table.add_row(f"tiny:{name}", "-", f"random weights, made in code (tests):"
                          f" transformers' {config['model_type']} config")
        table.add_row(escape("Org/Name[@revision]"), "on first use",
                      "any model on the Hugging Face Hub, at a branch, tag or commit (kvbench"
                      " models download fetches it ahead); or a local checkpoint folder")
    else:
        from kvbench.suite.loader import suite_descriptions
        from kvbench.suite.locate import shipped_folder

        table.add_column("suite")
        table.add_column("description")
        shipped = shipped_folder()
        for path, description in suite_descriptions(shipped):
            table.add_row(path.relative_to(shipped).with_suffix("").as_posix(),
                          escape(description))
        local = Path("suites")
        if local.is_dir() and local.resolve() != shipped:
            for path, description in suite_descriptions(local):
                table.add_row(escape(str(path)), escape(description))
    console.print(table)


def _described(registry: Any, name: str) -> type:
    """The class registered as `name`, its docstring printed (an unknown name fails, saying
    what is known)."""
    from kvbench.config import describe

    try:
        cls = registry.get(name)
    except LookupError as exc:
        fail(str(exc))
    console.print(escape(describe.unwrapped(describe.docstring(cls)) or name), end="\n\n")
    return cls


def _show_method(name: str) -> None:
    from kvbench.methods import METHODS

    cls = _described(METHODS, name)
    console.print(_parameters_table(f"parameters of {name}", cls))


def _show_benchmark(name: str) -> None:
    from kvbench.config import describe
    from kvbench.benchmarks import BENCHMARKS

    cls = _described(BENCHMARKS, name)
    console.print(escape(describe.unwrapped(describe.docstring(cls.Params))), end="\n\n")
    console.print(_parameters_table(f"parameters of {name}", cls.Params))
    table = Table(title=f"metrics of {name}",
                  caption="timing: varies run to run, kept with its samples; the gate judges a"
                          " ratio timing against a reference timed in the same repeat, an"
                          " absolute one only when the suite asks")
    for column in ("metric", "unit", "better", "timing", "definition"):
        table.add_column(column)
    for metric, spec in cls.metrics.items():
        table.add_row(metric, spec.unit or "-", spec.direction, spec.timing or "no",
                      escape(spec.description or describe.UNKNOWN))
    console.print(table)


def _parameters_table(title: str, config: type) -> Table:
    from kvbench.config import describe

    table = Table(title=title)
    # the meaning is the long text: it takes the width the other columns leave
    table.add_column("parameter", no_wrap=True)
    table.add_column("type", max_width=20)
    table.add_column("default", max_width=16)
    table.add_column("range", max_width=20)
    table.add_column("meaning", ratio=1)
    for p in describe.parameters(config):
        table.add_row(p.name, escape(p.type), escape(p.default), escape(p.range),
                      escape(p.meaning))
    return table
