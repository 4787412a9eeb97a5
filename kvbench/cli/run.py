"""`kvbench run SUITE`: every case, its claims, and the baseline gate."""
from __future__ import annotations

import dataclasses
import importlib
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import (
    EXIT_BASELINE, EXIT_CRASHED, EXIT_INTERRUPTED, console, err, fail, load_suite_or_exit,
    overrides_or_exit, say_refused, suite_options,
)
from kvbench.cli.progress import RichProgress
from kvbench.cli.verdicts import exit_code, summary


@click.command()
@click.argument("suite_path", metavar="SUITE", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Output folder (default: runs/<suite name>). An earlier run there is moved "
                   "to previous/ unless --resume.")
@click.option("--only", help="Run cases whose id matches this glob (or contains this text).")
@click.option("--methods", help="Comma-separated method labels or names (globs allowed).")
@suite_options
@click.option("--repeats", type=click.IntRange(min=1), help="Repeats for timed metrics.")
@click.option("--limit", type=click.IntRange(min=1), help="Run at most N cases (after filters).")
@click.option("--baseline", type=click.Path(dir_okay=False),
              help="Gate against this stored results file (exit 1 on regression). A case the "
                   "baseline defines otherwise (another setting) is run, marked not comparable "
                   "and named with the command that refreshes its baseline; the rest are gated.")
@click.option("--strict", is_flag=True,
              help="With --baseline: a case the baseline defines otherwise is refused (exit 4) "
                   "before anything runs.")
@click.option("--resume", is_flag=True, help="Keep finished cases from --out and run the rest.")
@click.option("--isolate", is_flag=True,
              help="Run each case in a fresh process: a crash, an out-of-memory kill or a hang "
                   "in native code costs that case only, and memory starts clean per case "
                   "(each case loads its model again).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="Where cases run: local (this process, a child per case with --isolate, "
                   "or one per GPU with --gpus) or ray (each case a Ray task; needs `pip "
                   "install 'kvbench[ray]'`).")
@click.option("--address",
              help="With --executor ray: the cluster to join (host:port, or auto for the one "
                   "`ray start` made on this machine). Default: start a local Ray on this "
                   "machine's cores.")
@click.option("--gpus", metavar="all|0,1,...",
              help="Run one case per GPU at a time on this machine's CUDA devices (all, or "
                   "their indices), each case in its own process that sees its GPU alone "
                   "(CUDA_VISIBLE_DEVICES), the longest cases first. For suites on device cuda "
                   "or auto.")
@click.option("--cpus-per-gpu", type=click.IntRange(min=1),
              help="With --gpus or --executor ray: the torch threads of a GPU case whose suite "
                   "sets no `threads`, and on Ray the CPUs it asks for (per GPU). Default: with "
                   "--gpus this machine's cores shared out among the GPUs; on Ray 2.")
@click.option("--shard", metavar="I/N",
              help="Run only shard I of N: the suite's cases dealt into N parts of about equal "
                   "expected cost (samples x context tokens x the method's relative cost; "
                   "--dry-run shows the split), for CI job matrices; join the shards with "
                   "`kvbench merge`.")
@click.option("--dry-run", is_flag=True, help="List the expanded cases and exit.")
def run(suite_path, out_dir, only, methods, model, model_dtype, device, backend, settings,
        repeats, limit, baseline, strict, resume, isolate, executor, address, gpus, cpus_per_gpu,
        shard, dry_run):
    """Run a suite: every case, its claims, and the baseline gate.

    SUITE is a YAML file, or the name of a suite shipped with kvbench (`kvbench run quick`;
    `kvbench list suites` names them). Any suite runs on any model:

    \b
      kvbench run ruler --model Qwen/Qwen3-8B --dtype bfloat16 --set ruler.length=32768
      kvbench validate ruler --model Qwen/Qwen3-8B --set ruler.length=32768  # check it first

    --model, --dtype, --device, --backend and --set are recorded in the results; --resume
    continues a run only with the same ones."""
    if executor == "ray" and isolate:  # options that cannot go together: before anything else
        fail("--isolate is for --executor local: on Ray every case already runs in a "
             "worker process, and a worker that dies costs its case one retry")
    if executor != "ray" and address:
        fail("--address is for --executor ray")
    if executor == "ray" and gpus:
        fail("--gpus is for --executor local: on Ray each GPU case asks Ray for its GPU(s)")
    if cpus_per_gpu and not gpus and executor != "ray":
        fail("--cpus-per-gpu is for --gpus or --executor ray")
    if strict and not baseline:
        fail("--strict is for --baseline")
    try:
        importlib.import_module("torch")  # every case needs it: refused before any work
    except ImportError as exc:
        fail(f"kvbench run needs torch ({exc}): pip install 'kvbench[torch]'. validate, report,"
             " compare and baseline save work without it")
    if executor == "ray":
        from kvbench.run.ray_executor import RayUnavailable, import_ray

        try:
            import_ray()  # before any work: refused with the install hint
        except RayUnavailable as exc:
            fail(str(exc))
    from kvbench.run.shard import parse_shard, select_shard
    from kvbench.suite.select import SelectionError, select_cases

    if shard is not None:
        try:
            shard = parse_shard(shard)
        except ValueError as exc:
            fail(str(exc))
    gpu_list = _gpus_or_exit(gpus) if gpus else None

    # The model, device and backend decide which methods and benchmarks are valid: the suite is
    # checked with them.
    suite = load_suite_or_exit(
        suite_path, overrides_or_exit(model, model_dtype, device, backend, settings))
    if repeats is not None:  # every entry's, its own included
        suite.cases = [dataclasses.replace(c, repeats=repeats) for c in suite.cases]
    try:
        cases = select_cases(suite, only, methods, limit)
    except SelectionError as exc:
        fail(str(exc))
    _refuse_placement(cases, gpu_list is not None, executor)
    say_refused(cases)  # those the filters chose: the others are no concern of this run
    out_dir = Path(out_dir or _default_out_dir(suite.name, shard))
    if dry_run:
        _list_cases(suite, cases if shard is None else select_shard(suite.cases, cases, shard),
                    shard, _finished_ids(out_dir) if resume else None)
        return
    # what an interrupted run prints to continue it: the same cases, the same settings
    again = [("--only", only), ("--methods", methods), ("--model", model),
             ("--dtype", model_dtype), ("--device", device), ("--backend", backend),
             *(("--set", text) for text in settings), ("--repeats", repeats),
             ("--limit", limit), ("--baseline", baseline), ("--strict", strict),
             ("--isolate", isolate), ("--address", address), ("--gpus", gpus),
             ("--cpus-per-gpu", cpus_per_gpu),
             ("--executor", executor if executor != "local" else None),
             ("--shard", shard and f"{shard.index}/{shard.count}")]
    resume_command = shlex.join(
        ["kvbench", "run", suite_path, "--out", str(out_dir)]
        + [part for flag, value in again if value not in (None, False)
           for part in ([flag] if value is True else [flag, str(value)])] + ["--resume"])
    runner = _start_executor(executor, address, isolate, gpu_list, cpus_per_gpu)
    try:
        selection = {k: v for k, v in (("only", only), ("methods", methods), ("limit", limit))
                     if v is not None}
        # what the command line changed of the suite, recorded (--resume insists on it)
        changed = {"model": model, "model_dtype": model_dtype, "set": list(settings) or None}
        _run_with(runner, suite, resume_command, cases, out_dir, baseline, strict, resume,
                  repeats, shard, selection, changed)
    finally:
        runner.close()


def _default_out_dir(suite_name: str, shard) -> Path:
    folder = Path("runs") / suite_name
    return folder if shard is None else folder / f"shard-{shard.index}-of-{shard.count}"


def _finished_ids(out_dir: Path) -> set[str]:
    """The cases --resume would keep from out_dir (none when it holds no run)."""
    from kvbench.results import ResultsFileError, read_jsonl
    from kvbench.run.files import JSONL

    if not (out_dir / JSONL).exists():
        return set()
    try:
        return {case.id for case in read_jsonl(out_dir / JSONL).cases}
    except ResultsFileError as exc:
        fail(f"{exc}; --resume could not continue from it")


def _list_cases(suite, cases, shard, finished: set[str] | None) -> None:
    """The dry run's table, with each case's expected cost; with --shard, how the suite's cases
    are dealt into the shards; with --resume, which cases are kept and which would run."""
    from kvbench.run.cost import expected_cost, shown
    from kvbench.run.shard import split

    costs = {case.id: expected_cost(case) for case in cases}
    title = f"{suite.name}: {len(cases)} case(s)" + (f", shard {shard}" if shard else "")
    if finished is not None:
        kept = sum(case.id in finished for case in cases)
        title += f": {kept} kept, {len(cases) - kept} to run"
    title += f"; expected cost {shown(sum(costs.values()))}"
    caption = None
    if shard:
        parts = split(suite.cases, shard.count)
        caption = (f"the suite's {len(suite.cases)} case(s) by expected cost: " + "; ".join(
            f"shard {i}/{shard.count}: {len(part.case_ids)} case(s), cost {shown(part.cost)}"
            for i, part in enumerate(parts, start=1)))
    table = Table(title=title, caption=caption)
    columns = ("case", "model", "cost", "claims") + (("resume",) if finished is not None
                                                     else ())
    for column in columns:
        table.add_column(column, overflow="fold")
    for case in cases:
        row = [escape(case.id), case.model or "-", shown(costs[case.id]),
               escape("; ".join(c.text for c in case.claims))]
        if finished is not None:
            row.append("kept" if case.id in finished else "to run")
        table.add_row(*row)
    console.print(table)


def _gpus_or_exit(text: str) -> list[int]:
    """--gpus as indices of the CUDA devices here; refused when one does not exist."""
    from kvbench.run.local_gpus import parse_gpus, visible_gpu_count

    try:
        return parse_gpus(text, visible_gpu_count())
    except ValueError as exc:
        fail(str(exc))


def _refuse_placement(cases, gpus: bool, executor: str) -> None:
    """Cases that --gpus or Ray cannot place (a CPU-only suite on --gpus, a case naming its
    own cuda:N), refused before any work."""
    if gpus:
        from kvbench.run.local_gpus import gpu_refusal

        refusal = gpu_refusal(cases)
    elif executor == "ray":
        from kvbench.run.ray_executor import ray_refusal

        refusal = ray_refusal(cases)
    else:
        return
    if refusal:
        fail(refusal)


def _start_executor(kind: str, address: str | None, isolate: bool, gpus: list[int] | None,
                    cpus_per_gpu: int | None):
    from kvbench.run.executors import ChildProcesses, InProcess

    if kind == "local" and gpus is not None:
        from kvbench.run.local_gpus import LocalGPUs

        return LocalGPUs(gpus, cpus_per_gpu)
    if kind == "local":
        return ChildProcesses() if isolate else InProcess()
    from kvbench.run.ray_executor import CPUS_PER_GPU, RayExecutor, RayUnavailable

    try:
        return RayExecutor(address=address, status=lambda text: console.print(f"{text} ..."),
                           cpus_per_gpu=cpus_per_gpu or CPUS_PER_GPU)
    except RayUnavailable as exc:
        fail(str(exc))


def _load_baseline_or_exit(path: str, suite, key: str, cases, strict: bool):
    """The baseline, refused (exit 4) before running when it cannot judge this run: another
    schema, suite or machine, or (strict) a selected case defined otherwise there."""
    from kvbench.judge.baseline import baseline_problems, definition_problems

    if not Path(path).exists():
        fail(f"baseline {path} does not exist (make one with `kvbench baseline save`)",
             EXIT_BASELINE)
    from kvbench.results import ResultsFileError, load_results

    try:
        baseline = load_results(path)
    except ResultsFileError as exc:
        fail(f"baseline {exc}", EXIT_BASELINE)
    except OSError as exc:
        fail(f"baseline {path} cannot be read: {exc}", EXIT_BASELINE)
    problems = baseline_problems(baseline, suite.name, key)
    if problems:
        fail(f"baseline {path} is not comparable: " + "; ".join(problems), EXIT_BASELINE)
    problems = definition_problems(baseline, [case.record() for case in cases])
    if problems:
        shown = "\n  ".join(problems[:10]) + ("\n  ..." if len(problems) > 10 else "")
        if strict:
            fail(f"baseline {path} is not comparable (--strict): {len(problems)} case(s) are "
                 f"defined otherwise there:\n  {shown}", EXIT_BASELINE)
        console.print(f"[yellow]baseline {escape(path)}:[/] {len(problems)} case(s) are defined "
                      f"otherwise there; they run and are marked not comparable, the rest are "
                      f"gated (--strict refuses them):\n  {escape(shown)}", soft_wrap=True)
    return baseline


def _run_with(executor, suite, resume_command, cases, out_dir, baseline, strict, resume,
              repeats, shard, selection, changed):
    from kvbench.run.ray_executor import RayUnavailable

    try:
        _, machine = executor.machine(cases[0].device, cases[0].backend)
    except (ValueError, RayUnavailable) as exc:
        fail(str(exc))
    baseline_result = None
    if baseline:
        baseline_result = _load_baseline_or_exit(baseline, suite, machine["key"], cases,
                                                 strict)

    from kvbench.judge.gate import gate
    from kvbench.report.markdown import write_reports
    from kvbench.run.files import JSON, JSONL, OutDirBusy, hold_out_dir
    from kvbench.run.runner import ResultsNotWritten, ResumeError, run_suite

    _interrupt_on_sigterm()
    try:
        with hold_out_dir(out_dir):
            outcome = run_suite(suite, out_dir, cases=cases, resume=resume,
                                progress=RichProgress(), repeats_override=repeats,
                                executor=executor, shard=shard, selection=selection,
                                overrides=changed)
            result = outcome.result
            gate_report = None
            if baseline_result is not None:  # as `compare --gate` judges the same files
                gate_report = gate(result, baseline_result, strict=strict)
            try:
                write_reports(result, out_dir, gate=gate_report)
            except OSError as exc:
                fail(f"cannot write the report in {out_dir}: {exc}; the results are saved "
                     f"(`kvbench report {out_dir / JSON}` makes it again)", EXIT_CRASHED)
    except (ResumeError, OutDirBusy, RayUnavailable) as exc:
        fail(str(exc))
    except ResultsNotWritten as exc:
        fail(exc.strerror, EXIT_CRASHED)
    except OSError as exc:  # the folder itself: not creatable, not writable
        fail(f"cannot use {out_dir}: {exc}")
    except KeyboardInterrupt:
        _report_what_finished(out_dir)
        err.print(
            f"\n[yellow]interrupted.[/] Finished cases are kept in {out_dir / JSONL}. "
            f"Continue with:\n  {escape(resume_command)}", soft_wrap=True)
        sys.exit(EXIT_INTERRUPTED)
    summary(result, gate_report, out_dir, baseline)
    sys.exit(exit_code(result, gate_report))


# `timeout` signals the process and then its group, so one stop can arrive twice a few
# milliseconds apart: the second must not cut short the writing of what finished.
REPEATED_SIGNAL_S = 1.0


def _interrupt_on_sigterm() -> None:
    """SIGTERM (a cancelled CI job, `timeout`) stops a run as Ctrl-C does: the finished cases
    are judged and written to results.json and the report, not only to results.jsonl. A signal
    within REPEATED_SIGNAL_S of the first is the same stop; a later one stops at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    first: list[float] = []

    def stop(signum, frame):
        if first and time.monotonic() - first[0] < REPEATED_SIGNAL_S:
            return
        first[:] = [time.monotonic()]
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def _report_what_finished(out_dir: Path) -> None:
    """report.md and its figures for the cases an interrupted run finished (results.json)."""
    from kvbench.report.markdown import write_reports
    from kvbench.results import load_results
    from kvbench.run.files import JSON

    try:
        write_reports(load_results(out_dir / JSON), out_dir)
    except (OSError, ValueError) as exc:  # results.jsonl still holds every finished case
        err.print(f"no report written for the finished cases: {exc}")
