"""Runs expanded cases into an output folder: results.jsonl (one line per finished case,
fsynced) and --resume, claims across cases, results.json at the end; one run per output folder
at a time. Where the cases run is an executor's business (kvbench.run.executors)."""
from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvbench.benchmarks import BENCHMARKS
from kvbench.methods import METHODS
from kvbench.hardware import KVBENCH_VERSION, code_provenance, kvbench_git_sha
from kvbench.judge.claims import judge
from kvbench.judge.paired import paired_samples
from kvbench.results import (
    SCHEMA_VERSION, CaseResult, ResultsFileError, RunHeader, RunResult, SuiteRecord,
    append_jsonl, case_line, header_line, read_jsonl, save_jsonl, save_results,
)
from kvbench.run.case import DEFAULT_THREADS, Progress, Silent, judge_own
from kvbench.run.executors import ChildProcesses, Executor, InProcess
from kvbench.run.files import (
    FILES, JSON, JSONL, PREDICTIONS, archive_previous, hold_out_dir, now,
)
from kvbench.run.shard import Shard, select_shard, split, split_record
from kvbench.suite.case import Case, LoadedSuite
from kvbench.suite.versions import CLAIMS, TIMEOUTS, timeouts, without

@dataclass
class RunOutcome:
    result: RunResult
    out_dir: Path
    skipped: int  # cases taken over from an earlier run by --resume


class ResumeError(ValueError):
    """The folder holds results that cannot be resumed with this suite or these settings."""


class ResultsNotWritten(OSError):
    """A finished case could not be saved (a full disk, say): the run stops; what was saved
    before is intact and --resume continues from it."""


def _resume_state(out_dir: Path, suite: LoadedSuite, settings: dict[str, Any],
                  progress: Progress) -> tuple[RunHeader, list[CaseResult]]:
    path = out_dir / JSONL
    try:
        jsonl = read_jsonl(path)
    except ResultsFileError as exc:
        raise ResumeError(f"{exc}; move {out_dir} aside or run without --resume") from None
    header = jsonl.header
    if header is None:
        raise ResumeError(f"{path} has no header line; cannot resume from it")
    if header.schema_version != SCHEMA_VERSION:
        raise ResumeError(f"{path} was written by another kvbench (schema "
                          f"{header.schema_version}, this one writes {SCHEMA_VERSION}); run "
                          "without --resume or with another --out")
    # The settings first: --backend also changes the suite's hash, and this names it.
    def shown(value: Any) -> str:
        return "not set" if value is None else repr(value)

    changed = [f"{key} {shown(header.settings.get(key))} then, {shown(value)} now"
               for key, value in settings.items() if header.settings.get(key) != value]
    if changed:
        raise ResumeError(f"{path} was run with other settings ({'; '.join(changed)}); resume "
                          "with the same --model, --dtype, --device, --backend, --set and "
                          "--repeats, or use another --out")
    cases, stopped = jsonl.cases, []
    if header.suite.hash != suite.hash:
        measured = [without(resolved, CLAIMS, TIMEOUTS)
                    for resolved in (header.suite.resolved, suite.resolved)]
        if measured[0] != measured[1]:
            raise ResumeError(
                f"{path} was written by a different version of suite {suite.name!r} "
                f"(hash {header.suite.hash[:12]} != {suite.hash[:12]}); run without --resume "
                "or with another --out"
            )
        # Claims judge measurements and timeouts end them; neither changes what a case measures:
        # judge the finished cases again, and run again those a changed timeout stopped.
        progress.notice(f"{path}: only the suite's claims or timeouts changed since this run "
                        "started; every finished case's claims are judged again")
        retimed = timeouts(header.suite.resolved) != timeouts(suite.resolved)
        header = header.model_copy(update={"suite": SuiteRecord(
            name=suite.name, path=suite.path, hash=suite.hash, resolved=suite.resolved)})
        claims = {case.id: case.claims for case in suite.cases}
        for record in cases:
            if record.status == "ok":
                record.claims = judge_own(claims.get(record.id, []), record.metrics)
        stopped = [record.id for record in cases if record.status == "timeout"] if retimed else []
    if jsonl.torn_tail:
        # A kill mid-write cut the last line: drop it so the next append starts clean.
        size = path.stat().st_size
        with open(path, "r+b") as fh:
            fh.truncate(size - len(jsonl.torn_tail))
        cut = re.search(r'"id":"([^"]+)"', jsonl.torn_tail.decode("utf-8", errors="replace"))
        what = f"case {cut.group(1)!r}" if cut else "a case"
        progress.notice(f"{path}: the last line was cut mid-write ({what}); it is dropped and "
                        "that case runs again")
    if stopped:
        cases = [record for record in cases if record.id not in stopped]
        save_jsonl(path, RunResult(**header.model_dump(), cases=cases))
        progress.notice(f"{len(stopped)} case(s) stopped by the old timeout run again: "
                        + ", ".join(stopped))
    return header, cases


def plugins_of(cases: list[Case]) -> dict[str, dict[str, str]]:
    """Where each method and benchmark from outside kvbench came from, by module
    (kvbench.hardware.code_provenance): a changed plug-in shows in the results."""
    classes = {METHODS.get(c.method) for c in cases if c.method} | {
        BENCHMARKS.get(c.benchmark) for c in cases}
    found = [code_provenance(cls) for cls in classes
             if cls.__module__.partition(".")[0] != "kvbench"]
    return {entry["module"]: entry for entry in sorted(found, key=lambda e: e["module"])}


def run_suite(
    suite: LoadedSuite,
    out_dir: str | Path,
    cases: list[Case] | None = None,
    resume: bool = False,
    progress: Progress | None = None,
    repeats_override: int | None = None,
    isolate: bool = False,
    executor: Executor | None = None,
    shard: Shard | None = None,
    selection: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
) -> RunOutcome:
    """Run `cases` (default: all of the suite's) into out_dir.

    Every finished case is appended to results.jsonl and fsynced before the next starts;
    results.json is written at the end, and also when interrupted (then `interrupted` is set
    and KeyboardInterrupt is raised again for the caller to report). repeats_override is the
    command line's --repeats, recorded so that --resume can insist on it. shard: run only its
    part of `cases` (kvbench.run.shard); the header keeps all of `cases` as planned, for `kvbench
    merge` to find what no shard ran. isolate: each case in a fresh child process
    (kvbench.run.isolated); executor: where the cases run (default in this process, or as isolate
    says); the caller closes an executor it passes. selection: the filters that chose `cases`
    (the command line's --only, --methods, --limit), recorded for the gate. overrides: what the
    command line changed of the suite (its --model, --dtype, --set), recorded with the device,
    backend and repeats; --resume insists on them.
    """
    out_dir = Path(out_dir)
    progress = progress or Silent()
    planned = suite.cases if cases is None else cases
    cases = planned if shard is None else select_shard(suite.cases, planned, shard)
    device = planned[0].device if planned else "cpu"
    backend = planned[0].backend if planned else "torch"
    own = executor is None
    executor = executor or (ChildProcesses() if isolate else InProcess())
    try:
        return _run_suite(suite, out_dir, cases, planned, resume, progress, repeats_override,
                          executor, shard, device, backend, selection or {}, overrides or {})
    finally:
        if own:
            executor.close()


def _run_suite(suite, out_dir, cases, planned, resume, progress, repeats_override, executor,
               shard, device, backend, selection, overrides) -> RunOutcome:
    device_name, machine = executor.machine(device, backend)
    if shard is not None and not cases:
        progress.notice(f"shard {shard} holds none of the {len(planned)} case(s); an empty run "
                        "is written, for `kvbench merge`")
    settings = {"device": device_name, "backend": backend, "repeats": repeats_override,
                "shard": shard and str(shard), **overrides}
    if shard is not None:  # the parts' sizes and costs: how evenly the suite was dealt
        settings["split"] = split_record(split(suite.cases, shard.count))
    with hold_out_dir(out_dir):
        finished: list[CaseResult] = []
        if resume and (out_dir / JSONL).exists():
            header, finished = _resume_state(out_dir, suite, settings, progress)
        else:
            archive_previous(out_dir)
            header = RunHeader(
                kvbench_version=KVBENCH_VERSION, git_sha=kvbench_git_sha(),
                plugins=plugins_of(planned), machine=machine,
                suite=SuiteRecord(
                    name=suite.name, path=suite.path, hash=suite.hash, resolved=suite.resolved
                ),
                settings=settings,
                planned=[c.id for c in planned],
                selection=selection,
                started=now(),
            )
            _append(out_dir / JSONL, header_line(header), kept=0)
        return _run_cases(suite, cases, out_dir, header, finished, progress, executor)


def _run_cases(suite: LoadedSuite, cases: list[Case], out_dir: Path, header: RunHeader,
               finished: list[CaseResult], progress: Progress, executor: Executor
               ) -> RunOutcome:
    done = {c.id for c in finished}
    todo = [c for c in cases if c.id not in done]
    result = RunResult(**header.model_dump(), cases=list(finished))
    progress.start(total=len(todo), skipped=len(cases) - len(todo))
    keep = functools.partial(_keep_line, out_dir / PREDICTIONS)
    refused = [c.record() for c in todo if c.refused]  # recorded first, never run
    records = executor.run([c for c in todo if not c.refused], progress, keep, out_dir / FILES)
    try:
        for record in itertools.chain(refused, records):
            _append(out_dir / JSONL, case_line(record), kept=len(result.cases))
            result.cases.append(record)
            progress.case_finished(record)
    except BaseException as exc:
        result.interrupted = isinstance(exc, KeyboardInterrupt)
        _finish(result, suite, out_dir, progress, strict=False)  # must not hide `exc`
        raise
    finally:
        records.close()  # an executor's cases still out are stopped
    _finish(result, suite, out_dir, progress, strict=True)
    return RunOutcome(result=result, out_dir=out_dir, skipped=len(cases) - len(todo))


def judge_across(result: RunResult, cases: list[Case]) -> None:
    """Adds to each finished case the verdicts of its claims against another case of the run
    (`metric / LABEL op value`): missing when that case did not run or did not finish ok; a
    difference judged on the paired interval when both recorded the metric per sample on the
    same samples."""
    records = {record.id: record for record in result.cases}
    for case in cases:
        record = records.get(case.id)
        if record is None or record.status != "ok":
            continue
        for claim in case.claims:
            if claim.reference is None:
                continue
            other_id = claim.reference_id(case.id, case.benchmark, case.method_label)
            other = records.get(other_id)
            done = other is not None and other.status == "ok"
            metrics = other.metrics if done else None
            # both cases' per-sample values on the same samples: a difference is judged paired
            pairs = paired_samples(record, other, claim.metric) if done else None
            record.claims.append(judge(claim, record.metrics, metrics, other_id, pairs))


def _keep_line(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def _append(path: Path, line, kept: int) -> None:
    try:
        append_jsonl(path, line)
    except OSError as exc:
        raise ResultsNotWritten(
            exc.errno, f"cannot write {path}: {exc.strerror or exc}; the {kept} case(s) saved "
                       "before are kept in it; free the space and continue with --resume"
        ) from exc


def _finish(result: RunResult, suite: LoadedSuite, out_dir: Path, progress: Progress,
            strict: bool) -> None:
    """results.json, in the suite's case order. strict=False: another error is on its way out
    and a failure to write must not replace it (results.jsonl holds every saved case)."""
    progress.stop()
    torch.set_num_threads(DEFAULT_THREADS)
    order = {c.id: i for i, c in enumerate(suite.cases)}
    result.cases.sort(key=lambda c: order.get(c.id, len(order)))
    judge_across(result, suite.cases)
    result.finished = now()
    try:
        save_results(out_dir / JSON, result)
    except OSError as exc:
        if strict:
            raise ResultsNotWritten(
                exc.errno, f"cannot write {out_dir / JSON}: {exc.strerror or exc}; every finished "
                           f"case is in {out_dir / JSONL} (`kvbench report` reads it)") from exc
