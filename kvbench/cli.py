"""kvbench's command line: parse, call the library, render with rich."""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvbench import __version__

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_CRASHED, EXIT_BASELINE = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130

console = Console()
err = Console(stderr=True)


def _fail(message: str, code: int = EXIT_INVALID):
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    sys.exit(code)


def _load_suite_or_exit(path: str, **defaults):
    from kvbench.suite.errors import SuiteError
    from kvbench.suite.loader import load_suite

    try:
        return load_suite(path, **defaults)
    except SuiteError as exc:
        err.print(f"[bold red]invalid suite[/] ({len(exc.issues)} problem(s)):")
        for line in str(exc).splitlines():
            # one issue per line, greppable; printed as is (rich would turn "x.yaml:100:" into
            # an emoji and markup-like text into styles)
            err.print(f"  {line}", soft_wrap=True, markup=False, emoji=False, highlight=False)
        sys.exit(EXIT_INVALID)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvbench")
def main():
    """Benchmark and validate KV-cache compression methods.

    Suites are YAML files (see `kvbench schema`); `kvbench run SUITE` runs one and writes
    results.json, results.jsonl and report.md. Exit codes: 0 all claims hold and no regression,
    1 a claim failed or a regression, 2 invalid suite or command, 3 a case crashed,
    4 baseline missing or not comparable.
    """


# ---------------------------------------------------------------- run


class _RichProgress:
    """Progress bar over cases, the running case's status, one line per finished case."""

    def __init__(self):
        self.bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=console,
        )
        self.task = None
        self.case_id = ""

    def start(self, total, skipped):
        if skipped:
            console.print(f"resuming: {skipped} finished case(s) kept, {total} to run")
        self.bar.start()
        self.task = self.bar.add_task("cases", total=total, status="")

    def notice(self, text):
        err.print(f"[yellow]note:[/] {escape(text)}", soft_wrap=True)

    def case_started(self, case):
        self.case_id = case.id
        self.bar.update(self.task, status=escape(case.id))

    def status(self, text):
        self.bar.update(self.task, status=escape(f"{self.case_id}: {text}"))

    def case_finished(self, result):
        mark = {"ok": "[green]ok[/]", "error": "[red]error[/]", "timeout": "[red]timeout[/]"}
        line = f"{mark[result.status]} {escape(result.id)} ({result.duration_s:.1f} s)"
        if result.claims:
            held = sum(c.verdict == "held" for c in result.claims)
            line += f"  claims {held}/{len(result.claims)}"
        if result.error:
            line += f"  [red]{escape(result.error.type)}: {escape(result.error.message[:200])}[/]"
        self.bar.console.print(line)
        self.bar.advance(self.task)

    def stop(self):
        self.bar.stop()


def _method_matches(case, pattern: str) -> bool:
    """--methods' one test, for the check and the filter alike: the label or the method's
    name matches the glob."""
    return fnmatch.fnmatchcase(case.method_label, pattern) or fnmatch.fnmatchcase(case.method,
                                                                                   pattern)


def _select_cases(suite, only, methods, limit):
    """The cases to run; a selection that leaves none exits 2 with what there is."""
    from kvbench.registry import did_you_mean

    cases = suite.cases
    if not cases:
        _fail(f"{suite.path} expands to no case (its benchmarks' `methods:` select none)")
    if methods:
        wanted = [m.strip() for m in methods.split(",") if m.strip()]
        names = sorted({c.method_label for c in cases} | {c.method for c in cases})
        for pattern in wanted:
            if not any(_method_matches(c, pattern) for c in cases):
                _fail(f"--methods: {pattern!r} matches no method label or name in {suite.path}."
                      f"{did_you_mean(pattern, names)} Available: {', '.join(names)}")
        cases = [c for c in cases if any(_method_matches(c, w) for w in wanted)]
    if only:
        pattern = only if any(ch in only for ch in "*?[") else f"*{only}*"
        chosen = [c for c in cases if fnmatch.fnmatchcase(c.id, pattern)]
        if not chosen:
            among = " among the --methods selection" if methods else ""
            shown = ", ".join(c.id for c in cases[:12]) + (", ..." if len(cases) > 12 else "")
            _fail(f"--only {only!r} matches no case{among}. Case ids: {shown} (all of them: "
                  f"`kvbench run {suite.path} --dry-run`)")
        cases = chosen
    if limit is not None:
        cases = cases[:limit]
    return cases


def _load_baseline_or_exit(path: str, suite, key: str):
    from kvbench.results import SCHEMA_VERSION, ResultsFileError, load_results

    if not Path(path).exists():
        _fail(f"baseline {path} does not exist (make one with `kvbench baseline save`)",
              EXIT_BASELINE)
    try:
        baseline = load_results(path)
    except ResultsFileError as exc:
        _fail(f"baseline {exc}", EXIT_BASELINE)
    except OSError as exc:
        _fail(f"baseline {path} cannot be read: {exc}", EXIT_BASELINE)
    problems = []
    if baseline.schema_version != SCHEMA_VERSION:
        problems.append(f"schema version {baseline.schema_version} != {SCHEMA_VERSION} (remake "
                        "it with this kvbench)")
    if baseline.suite.name != suite.name:
        problems.append(f"it is for suite {baseline.suite.name!r}, not {suite.name!r}")
    if baseline.machine.get("key") != key:
        problems.append(f"machine key {baseline.machine.get('key')!r} != this machine's {key!r}")
    if problems:
        _fail(f"baseline {path} is not comparable: " + "; ".join(problems), EXIT_BASELINE)
    return baseline


def _check_definitions_or_exit(path: str, baseline, cases) -> None:
    """Refuse before running when a selected case is defined otherwise in the baseline (method
    or benchmark settings, model, backend, threads): its results could never be compared. The
    data (token hashes) is checked after the run, by the gate."""
    from kvbench.gate import fingerprint_differences
    from kvbench.results import fingerprint
    from kvbench.runner import case_record

    stored = {c.id: c for c in baseline.cases}
    problems = []
    for case in cases:
        old = stored.get(case.id)
        if old is None or old.status != "ok":
            continue
        planned = case_record(case)
        planned.comparable = old.comparable  # the data is known only once the case has run
        planned.fingerprint = fingerprint(planned)
        differences = fingerprint_differences(old, planned)
        if differences:
            problems.append(f"{case.id}: " + "; ".join(differences))
    if problems:
        shown = "\n  ".join(problems[:10]) + ("\n  ..." if len(problems) > 10 else "")
        _fail(f"baseline {path} is not comparable: {len(problems)} case(s) are defined otherwise"
              f" there:\n  {shown}", EXIT_BASELINE)


def _claims_table(result) -> Table:
    table = Table(title="Claims", show_lines=False)
    for column in ("case", "claim", "measured", "verdict"):
        table.add_column(column, overflow="fold")
    style = {"held": "[green]held[/]", "failed": "[red]FAILED[/]", "missing": "[yellow]missing[/]"}
    for case in result.cases:
        for claim in case.claims:
            measured = "-" if claim.measured is None else f"{claim.measured:.6g}"
            table.add_row(escape(case.id), escape(claim.claim), measured, style[claim.verdict])
    return table


def _exit_code(result, gate_report) -> int:
    if gate_report is not None and gate_report.exit_code() == EXIT_BASELINE:
        return EXIT_BASELINE
    if any(c.status != "ok" for c in result.cases):
        return EXIT_CRASHED
    claims_ok = all(cl.verdict == "held" for c in result.cases for cl in c.claims)
    if not claims_ok or (gate_report is not None and gate_report.exit_code() != EXIT_OK):
        return EXIT_FAILED
    return EXIT_OK


def _summary(result, gate_report, out_dir: Path) -> None:
    claims = [cl for c in result.cases for cl in c.claims]
    held = sum(cl.verdict == "held" for cl in claims)
    errors = [c for c in result.cases if c.status != "ok"]
    if claims:
        console.print(_claims_table(result))
    parts = [f"claims held {held}/{len(claims)}", f"failed {len(claims) - held}"]
    if gate_report is not None:
        parts.append(f"regressions {len(gate_report.regressions)}")
        parts.append(f"improvements {len(gate_report.improvements)}")
    parts.append(f"errors {len(errors)}")
    console.print("[bold]summary:[/] " + ", ".join(parts))
    for case in errors:
        console.print(f"  [red]{case.status}[/] {escape(case.id)}: "
                      f"{escape(case.error.type)}: {escape(case.error.message[:300])}")
    if gate_report is not None:
        from kvbench.report.tables import fmt_number

        for reason in gate_report.reasons:
            console.print(f"  [yellow]gate:[/] {escape(reason)}")
        for row in gate_report.regressions:
            console.print(f"  [red]regression[/] {escape(row.case_id)} {row.metric}: "
                          f"{fmt_number(row.baseline)} -> {fmt_number(row.current)} "
                          f"({escape(row.rule)})")
    for case in result.cases:
        for warning in case.warnings:
            console.print(f"  [yellow]warning[/] {escape(case.id)}: {escape(warning)}")
    console.print(f"reports: {out_dir / 'report.md'}, {out_dir / 'results.json'}")


@main.command()
@click.argument("suite_path", metavar="SUITE", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Output folder (default: runs/<suite name>). An earlier run there is moved "
                   "to previous/ unless --resume.")
@click.option("--only", help="Run cases whose id matches this glob (or contains this text).")
@click.option("--methods", help="Comma-separated method labels or names (globs allowed).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "mps"]),
              help="Override the suite's device.")
@click.option("--backend", type=click.Choice(["torch", "mlx"]),
              help="Override the suite's backend: torch, or mlx (methods on MLX, models on "
                   "mlx-lm; every method and benchmark must support it).")
@click.option("--repeats", type=click.IntRange(min=1), help="Repeats for timed metrics.")
@click.option("--limit", type=click.IntRange(min=1), help="Run at most N cases (after filters).")
@click.option("--baseline", type=click.Path(dir_okay=False),
              help="Gate against this stored results file (exit 1 on regression).")
@click.option("--resume", is_flag=True, help="Keep finished cases from --out and run the rest.")
@click.option("--isolate", is_flag=True,
              help="Run each case in a fresh process: a crash, an out-of-memory kill or a hang "
                   "in native code costs that case only, and memory starts clean per case "
                   "(each case loads its model again).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="Where cases run: local (this process, or a child per case with --isolate) "
                   "or ray (each case a Ray task; needs `pip install 'kvbench[ray]'`).")
@click.option("--address",
              help="With --executor ray: the cluster to join (host:port, or auto for the one "
                   "`ray start` made on this machine). Default: start a local Ray on this "
                   "machine's cores.")
@click.option("--shard", metavar="I/N",
              help="Run only shard I of N: a stable split of the cases by id (CI job "
                   "matrices); join the shards with `kvbench merge`.")
@click.option("--dry-run", is_flag=True, help="List the expanded cases and exit.")
def run(suite_path, out_dir, only, methods, device, backend, repeats, limit, baseline, resume,
        isolate, executor, address, shard, dry_run):
    """Run a suite: every case, its claims, and the baseline gate."""
    try:
        import kvbench.backends.torch_backend  # noqa: F401 - imports torch
    except ImportError as exc:
        _fail(f"kvbench run needs torch ({exc}): pip install 'kvbench[torch]'. validate, report,"
              " compare and baseline save work without it")
    if executor == "ray":
        if isolate:
            _fail("--isolate is for --executor local: on Ray every case already runs in a "
                  "worker process, and a worker that dies costs its case one retry")
        from kvbench.ray_executor import RayUnavailable, import_ray

        try:
            import_ray()  # before any work: refused with the install hint
        except RayUnavailable as exc:
            _fail(str(exc))
    elif address:
        _fail("--address is for --executor ray")
    from kvbench.shard import parse_shard, select_shard

    if shard is not None:
        try:
            shard = parse_shard(shard)
        except ValueError as exc:
            _fail(str(exc))

    # The backend decides which methods and benchmarks are valid: the suite is checked with it.
    suite = _load_suite_or_exit(suite_path, **({"backend": backend} if backend else {}))
    overrides = {k: v for k, v in (("device", device), ("repeats", repeats)) if v is not None}
    if overrides:
        suite.cases = [dataclasses.replace(c, **overrides) for c in suite.cases]
    cases = _select_cases(suite, only, methods, limit)
    if dry_run:
        table = Table(title=f"{suite.name}: {len(cases)} case(s)"
                            + (f", shard {shard}" if shard else ""))
        for column in ("case", "model", "claims"):
            table.add_column(column, overflow="fold")
        for case in cases if shard is None else select_shard(suite.cases, cases, shard):
            table.add_row(escape(case.id), case.model or "-",
                          escape("; ".join(c.text for c in case.claims)))
        console.print(table)
        return
    runner = _start_executor(executor, address, isolate)
    try:
        _run_with(runner, suite, suite_path, cases, out_dir, baseline, resume, repeats, shard)
    finally:
        runner.close()


def _start_executor(kind: str, address: str | None, isolate: bool):
    from kvbench.runner import ChildProcesses, InProcess

    if kind == "local":
        return ChildProcesses() if isolate else InProcess()
    from kvbench.ray_executor import RayExecutor, RayUnavailable

    try:
        return RayExecutor(address=address, status=lambda text: console.print(f"{text} ..."))
    except RayUnavailable as exc:
        _fail(str(exc))


def _run_with(executor, suite, suite_path, cases, out_dir, baseline, resume, repeats, shard):
    from kvbench.ray_executor import RayUnavailable

    try:
        _, machine = executor.machine(cases[0].device, cases[0].backend)
    except (ValueError, RayUnavailable) as exc:
        _fail(str(exc))
    baseline_result = None
    if baseline:
        baseline_result = _load_baseline_or_exit(baseline, suite, machine["key"])
        _check_definitions_or_exit(baseline, baseline_result, cases)

    from kvbench.gate import gate
    from kvbench.report.markdown import write_reports
    from kvbench.runner import (
        OutDirBusy, ResultsNotWritten, ResumeError, hold_out_dir, run_suite,
    )

    default_dir = Path("runs") / suite.name
    if shard is not None:
        default_dir = default_dir / f"shard-{shard.index}-of-{shard.count}"
    out_dir = Path(out_dir or default_dir)
    try:
        with hold_out_dir(out_dir):
            outcome = run_suite(suite, out_dir, cases=cases, resume=resume,
                                progress=_RichProgress(), repeats_override=repeats,
                                executor=executor, shard=shard)
            result = outcome.result
            gate_report = None
            if baseline_result is not None:
                filtered = shard is not None or len(cases) != len(suite.cases)
                gate_report = gate(result, baseline_result, expect_all=not filtered)
            try:
                write_reports(result, out_dir, gate=gate_report)
            except OSError as exc:
                _fail(f"cannot write the report in {out_dir}: {exc}; the results are saved "
                      f"(`kvbench report {out_dir / 'results.json'}` makes it again)",
                      EXIT_CRASHED)
    except (ResumeError, OutDirBusy, RayUnavailable) as exc:
        _fail(str(exc))
    except ResultsNotWritten as exc:
        _fail(exc.strerror, EXIT_CRASHED)
    except OSError as exc:  # the folder itself: not creatable, not writable
        _fail(f"cannot use {out_dir}: {exc}")
    except KeyboardInterrupt:
        err.print(
            f"\n[yellow]interrupted.[/] Finished cases are kept in {out_dir / 'results.jsonl'}. "
            f"Continue with:\n  kvbench run {suite_path} --out {out_dir} --resume"
        )
        sys.exit(EXIT_INTERRUPTED)
    _summary(result, gate_report, out_dir)
    sys.exit(_exit_code(result, gate_report))


@main.command()
@click.argument("suite_path", metavar="SUITE", type=click.Path(dir_okay=False))
def validate(suite_path):
    """Check a suite without running it (exit 2 with file:line: key for each problem)."""
    suite = _load_suite_or_exit(suite_path)
    console.print(f"[green]valid:[/] {suite.name}: {len(suite.cases)} case(s)")
    if suite.note:
        console.print(f"[yellow]note:[/] {escape(suite.note)}", soft_wrap=True)


# ---------------------------------------------------------------- list, env, schema


@main.command("list")
@click.argument("what", type=click.Choice(["methods", "benchmarks", "models", "suites"]))
@click.argument("name", required=False)
def list_(what, name):
    """List registered methods, benchmarks, bundled models, or the suites under ./suites.

    Each method and benchmark is shown with its parameters and the first sentence of its
    docstring.

    `kvbench list methods NAME` and `kvbench list benchmarks NAME` show one of them: its whole
    docstring and every parameter with its type, default, allowed range and meaning (a "-"
    where the code states none); a benchmark also every metric it reports, with its unit,
    which way is better, whether it is a timing, and its exact definition. An unknown NAME
    exits 2 with the nearest names."""
    if name is not None:
        if what not in ("methods", "benchmarks"):
            _fail("a NAME is taken only by `kvbench list methods NAME` and"
                  " `kvbench list benchmarks NAME`")
        (_show_method if what == "methods" else _show_benchmark)(name)
        return
    from kvbench import describe

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
        for name in ("llama", "qwen3"):
            table.add_row(f"tiny:{name}", "-", "random weights, made in code (tests)")
    else:
        table.add_column("suite")
        table.add_column("description")
        import yaml

        for path in sorted(Path("suites").rglob("*.yaml")):
            try:
                description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
            except yaml.YAMLError:
                description = "(not valid YAML)"
            # a suite's description is its summary: all of it, its lines joined
            table.add_row(str(path), escape(" ".join(str(description or "").split())))
    console.print(table)


def _show_method(name: str) -> None:
    from kvbench import describe
    from kvbench.methods import METHODS

    try:
        cls = METHODS.get(name)
    except LookupError as exc:
        _fail(str(exc))
    console.print(escape(describe.docstring(cls) or name), end="\n\n")
    console.print(_parameters_table(f"parameters of {name}", cls))


def _show_benchmark(name: str) -> None:
    from kvbench import describe
    from kvbench.benchmarks import BENCHMARKS

    try:
        cls = BENCHMARKS.get(name)
    except LookupError as exc:
        _fail(str(exc))
    console.print(escape(describe.docstring(cls) or name), end="\n\n")
    console.print(escape(describe.docstring(cls.Params)), end="\n\n")
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
    from kvbench import describe

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


@main.command()
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda", "mps"]))
def env(device):
    """Print the machine fingerprint stored with every result."""
    from kvbench.backends.torch_backend import resolve_device
    from kvbench.hardware import fingerprint, git_sha

    info = fingerprint(str(resolve_device(device)))
    info["git_sha"] = git_sha()
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {escape(str(value))}")
    try:
        from kvbench.backends.mlx_backend import blas_info
        from kvbench.hardware import mlx_device
    except ImportError:
        console.print("[bold]mlx[/]: not installed (pip install 'kvbench[mlx]')")
        return
    blas, reference = blas_info()
    console.print(f"[bold]mlx_device[/]: {mlx_device()}")
    console.print(f"[bold]mlx_blas[/]: {escape(blas)}")
    if reference and mlx_device() == "cpu":
        err.print(
            "[yellow]warning:[/] MLX's CPU matrix products run on the reference BLAS (~50x slower"
            " than OpenBLAS): MLX runs here are for correctness, not speed. For a fast one, see"
            " README: MLX on Linux."
        )


@main.command()
def schema():
    """Print the suite file JSON schema."""
    from kvbench.suite.schema import suite_json_schema

    click.echo(json.dumps(suite_json_schema(), indent=2, sort_keys=True))


# ---------------------------------------------------------------- reports


def _load_results_or_exit(path: str, code: int = EXIT_INVALID):
    from kvbench.results import ResultsFileError, load_results

    if not Path(path).exists():
        _fail(f"{path} does not exist", code)
    try:
        return load_results(path)
    except ResultsFileError as exc:  # names the file and the fault
        _fail(str(exc), code)
    except OSError as exc:
        _fail(f"cannot read {path}: {exc}", code)


@main.command()
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
def report(results_paths, fmt, out_dir, link, readme, section):
    """Render a report from results.json (or results.jsonl) alone, without re-running.

    `kvbench report reports/*/results.json --format html --out reports/site` makes the results
    page of every committed run; open reports/site/index.html in a browser (`make site` makes
    reports/index.html, linking the runs' folders in place)."""
    if fmt == "html":
        if not out_dir or readme:
            _fail("--format html writes a folder: give --out DIR (and no --readme)")
        from kvbench.report.html import build_site

        runs = [(path, _load_results_or_exit(path)) for path in results_paths]
        try:
            page = build_site(runs, out_dir, link=link)
        except OSError as exc:
            _fail(f"cannot write {out_dir}: {exc}")
        console.print(f"wrote {page} ({len(runs)} run(s))")
        return
    if len(results_paths) > 1 or out_dir or link:
        _fail(f"--format {fmt} renders one run to stdout; several runs, or --out, are for "
              "--format html")
    results_path = results_paths[0]
    result = _load_results_or_exit(results_path)
    if bool(readme) != bool(section):
        _fail("--readme and --section go together")
    if readme:
        from kvbench.report.readme import inject_section, render_section_table

        try:
            inject_section(readme, section, render_section_table(result))
        except (ValueError, OSError) as exc:
            _fail(str(exc))
        console.print(f"updated section {section!r} in {readme}")
        return
    if fmt == "json":
        click.echo(result.model_dump_json(indent=2))
    else:
        from kvbench.report.markdown import render_markdown

        click.echo(render_markdown(result))


@main.command()
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
    from kvbench.report.compare import render_compare

    from kvbench.gate import gate

    code = EXIT_BASELINE if as_gate else EXIT_INVALID  # a broken baseline is a gate's exit 4
    a, b = _load_results_or_exit(a_path, code), _load_results_or_exit(b_path)
    # As a gate, a case A has and B lacks counts as lost; side by side it is only marked x.
    report = gate(b, a, expect_all=as_gate)
    click.echo(render_compare(a, b, report))
    if as_gate:
        sys.exit(_exit_code(b, report))


@main.command()
@click.argument("inputs", metavar="RUN...", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the merged results.json, results.jsonl and report.md.")
@click.option("--allow-mixed", is_flag=True,
              help="Join shards that ran on different machines (each case keeps its machine "
                   "key in info.machine).")
def merge(inputs, out_dir, allow_mixed):
    """Join the shards of one run (`kvbench run SUITE --shard I/N`) into one.

    Each RUN is a shard's output folder or its results.json (an interrupted shard's
    results.jsonl also works). Refused (exit 2): shards of different suites, kvbench versions,
    commits, settings or machines (see --allow-mixed), and a case in two shards. Shards or
    cases that are missing are listed and the rest is merged (exit 3); `kvbench run SUITE --out
    DIR --resume` then runs only what is missing. Otherwise it exits as `kvbench run` would
    for the merged run's claims. Needs no torch.
    """
    from kvbench.merge import MergeRefused, merge_runs
    from kvbench.report.markdown import write_reports
    from kvbench.results import save_jsonl, save_results

    out = Path(out_dir)
    runs = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            if out.resolve() == path.resolve():
                _fail(f"--out {out_dir} is one of the runs to merge; give another folder")
            found = [path / name for name in ("results.json", "results.jsonl")
                     if (path / name).exists()]
            path = found[0] if found else path / "results.json"
        runs.append((str(path), _load_results_or_exit(str(path))))
    try:
        merged = merge_runs(runs, allow_mixed=allow_mixed)
    except MergeRefused as exc:
        _fail(str(exc))
    result = merged.result
    try:
        save_results(out / "results.json", result)
        save_jsonl(out / "results.jsonl", result)
        _join_predictions([Path(path).parent for path, _ in runs], out)
        write_reports(result, out)
    except OSError as exc:
        _fail(f"cannot write {out}: {exc}", EXIT_CRASHED)
    console.print(f"merged {len(runs)} run(s) of suite {result.suite.name!r}: "
                  f"{len(result.cases)} case(s) on {', '.join(merged.machines)}")
    _summary(result, None, out)
    if not merged.complete:
        if merged.missing_shards:
            err.print(f"[red]missing shard(s):[/] {', '.join(merged.missing_shards)}")
        shown = ", ".join(merged.missing_cases[:10])
        more = ", ..." if len(merged.missing_cases) > 10 else ""
        err.print(f"[red]{len(merged.missing_cases)} planned case(s) in no run:[/] "
                  f"{escape(shown)}{more}\n  run them with: kvbench run {result.suite.path} "
                  f"--out {out} --resume", soft_wrap=True)
        sys.exit(EXIT_CRASHED)
    sys.exit(_exit_code(result, None))


def _join_predictions(folders: list[Path], out: Path) -> None:
    """The shards' per-sample records, and the files their cases kept, beside the merged run."""
    import shutil

    from kvbench.results import atomic_write_text

    texts = [(folder / "predictions.jsonl").read_text(encoding="utf-8") for folder in folders
             if (folder / "predictions.jsonl").exists()]
    if texts:
        atomic_write_text(out / "predictions.jsonl", "".join(texts))
    for folder in folders:
        if (folder / "files").is_dir():
            shutil.copytree(folder / "files", out / "files", dirs_exist_ok=True)


@main.group()
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

    result = _load_results_or_exit(results_path)
    if result.interrupted:
        _fail(f"{results_path} is from an interrupted run; finish it with --resume first")
    bad = [c.id for c in result.cases if c.status != "ok"]
    if bad and not allow_errors:
        _fail(f"{len(bad)} case(s) did not finish ok ({', '.join(bad[:5])}); "
              "fix them or pass --allow-errors")
    save_results(to_path, result)
    console.print(f"saved baseline for suite {result.suite.name!r} "
                  f"(machine {result.machine.get('key')}) to {to_path}")


# ---------------------------------------------------------------- models


@main.command()
@click.option("--model", default="bundled:smollm2-135m", show_default=True,
              help="Model spec: bundled:NAME, a local checkpoint folder, tiny:llama.")
@click.option("--method", "method_name", default="identity", show_default=True,
              help="The KV-cache method every request's cache is made of (a name from"
                   " `kvbench list methods` or module:Class).")
@click.option("--params", "params_json", default="{}", show_default=True,
              help='The method\'s parameters as JSON, e.g. \'{"bits": 3, "block": 64}\'.')
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; other than loopback only with --allow-remote.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--allow-remote", is_flag=True, help="Allow a --host that is not loopback.")
@click.option("--device", default="cpu", show_default=True,
              type=click.Choice(["auto", "cpu", "cuda", "mps"]))
@click.option("--threads", type=click.IntRange(min=1), help="torch threads (default: torch's).")
@click.option("--kv-budget", type=click.IntRange(min=1), metavar="BYTES",
              help="Admit a request only while the method's accounted KV bytes of the active"
                   " requests (each reserving its prompt + max_tokens) fit in BYTES; others wait.")
@click.option("--queue-timeout", default=600.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a request may wait for room before it gets 503.")
@click.option("--max-batch", default=32, show_default=True, type=click.IntRange(min=1),
              help="Most requests decoded together in one batched forward.")
@click.option("--calibration", default=512, show_default=True, type=click.IntRange(min=0),
              help="Tokens of offline text handed to methods that calibrate themselves.")
def serve(model, method_name, params_json, host, port, allow_remote, device, threads, kv_budget,
          queue_timeout, max_batch, calibration):
    """Serve a model over an OpenAI-compatible HTTP API with a kvbench method as every request's
    KV cache, decoding all active requests as one batch (continuous batching).

    Endpoints: /v1/completions and /v1/chat/completions (streaming with SSE), /v1/models,
    /health, /metrics (Prometheus: active and queued requests, KV bytes held, tokens). Requests
    may set ignore_eos and return_token_ids (vLLM's extensions). Needs the [serve] extra.
    """
    from kvbench.serve.server import check_host

    try:
        params = json.loads(params_json)
        if not isinstance(params, dict):
            raise ValueError("must be a JSON object")
    except ValueError as exc:
        _fail(f"--params: {exc}")
    try:
        check_host(host, allow_remote)
        from kvbench.serve.server import serve as run_server
    except ImportError as exc:
        _fail(f"kvbench serve needs the serve extra (pip install 'kvbench[serve]'): {exc}")
    except ValueError as exc:
        _fail(str(exc))
    try:
        run_server(model, method_name, params, host, port, device, threads, kv_budget,
                   queue_timeout, max_batch, calibration,
                   log=lambda message: print(f"kvbench serve: {message}", file=sys.stderr,
                                             flush=True))
    except ValueError as exc:  # a bad method, parameter or model spec
        _fail(str(exc))


@main.group()
def models():
    """Prepare and inspect models."""


@models.command("prepare")
@click.argument("name")
@click.option("--force", is_flag=True, help="Convert again even if already prepared.")
def models_prepare(name, force):
    """Convert a bundled model (e.g. smollm2-135m) into a local checkpoint once, and verify it."""
    from kvbench.models import BUNDLED, prepare_bundled
    from kvbench.registry import did_you_mean

    name = name.removeprefix("bundled:")
    if name not in BUNDLED:
        _fail(f"unknown bundled model {name!r}.{did_you_mean(name, BUNDLED)} "
              f"Known: {', '.join(BUNDLED)}")
    path = prepare_bundled(name, force=force, log=lambda m: console.print(escape(m)))
    console.print(f"[green]ready:[/] bundled:{name} at {path}")


if __name__ == "__main__":
    main()
