"""Runs expanded cases: isolation, per-case timeout, fixed seeds, results.jsonl and --resume,
one run per output folder at a time."""
from __future__ import annotations

import functools
import json
import os
import random
import re
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch

from kvbench import __version__
from kvbench.backends.torch_backend import resolve_device
from kvbench.benchmarks import BENCHMARKS, RunContext
from kvbench.claims import judge
from kvbench.hardware import fingerprint as machine_fingerprint
from kvbench.hardware import git_sha
from kvbench.memo import Memo
from kvbench.methods.base import build_method
from kvbench.results import (
    SCHEMA_VERSION, CaseError, CaseResult, ResultsFileError, RunHeader, RunResult, SuiteRecord,
    append_jsonl, case_line, fingerprint, header_line, read_jsonl, save_results,
)
from kvbench.shard import Shard, select_shard
from kvbench.suite.case import Case, LoadedSuite

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; two runs into one folder are not caught
    fcntl = None

JSONL = "results.jsonl"
JSON = "results.json"
PREDICTIONS = "predictions.jsonl"  # per-sample records benchmarks keep (RunContext.keep)
FILES = "files"  # files cases keep beside the results (RunContext.files_dir: server logs)
LOCK = ".kvbench.lock"
DEFAULT_THREADS = torch.get_num_threads()  # torch's default here, before any case sets it


class ResumeError(ValueError):
    """The folder holds results that cannot be resumed with this suite or these settings."""


class OutDirBusy(RuntimeError):
    """Another run is writing into the output folder."""


class ResultsNotWritten(OSError):
    """A finished case could not be saved (a full disk, say): the run stops; what was saved
    before is intact and --resume continues from it."""


class CaseTimeout(Exception):
    pass


class Progress(Protocol):
    def start(self, total: int, skipped: int) -> None: ...
    def notice(self, text: str) -> None: ...
    def case_started(self, case: Case) -> None: ...
    def status(self, text: str) -> None: ...
    def case_finished(self, result: CaseResult) -> None: ...
    def stop(self) -> None: ...


class _Silent:
    def start(self, total, skipped): ...
    def notice(self, text): ...
    def case_started(self, case): ...
    def status(self, text): ...
    def case_finished(self, result): ...
    def stop(self): ...


@dataclass
class RunOutcome:
    result: RunResult
    out_dir: Path
    skipped: int  # cases taken over from an earlier run by --resume


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextmanager
def _deadline(seconds: float | None):
    """Raise CaseTimeout in the main thread after `seconds` (SIGALRM; no timeout elsewhere)."""
    usable = seconds and hasattr(signal, "SIGALRM")
    usable = usable and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"case exceeded its timeout of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _seed_everything(seed: int, backend: str = "torch") -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if backend == "mlx":
        import mlx.core as mx

        mx.random.seed(seed)


def _device_name(device: torch.device, backend: str) -> str:
    """What ran the case: the torch device, or MLX's default device (torch still makes data)."""
    if backend == "mlx":
        import mlx.core as mx

        return f"mlx:{mx.default_device()}"
    return str(device)


class _ModelCache:
    """Loads each (model, device) once per run: cases share weights, never caches."""

    def __init__(self):
        self._loaded = {}

    def __call__(self, spec: str, device: torch.device, backend: str = "torch"):
        key = (spec, str(device), backend)
        if key not in self._loaded:
            if backend == "mlx":
                from kvbench.models.mlx_host import load_mlx_model

                self._loaded[key] = load_mlx_model(spec)
            else:
                from kvbench.models import load_model

                self._loaded[key] = load_model(spec, device)
        return self._loaded[key]


def case_record(case: Case) -> CaseResult:
    """The record of `case` before it runs: what defines it, nothing measured yet."""
    return CaseResult(
        id=case.id, benchmark=case.benchmark, bench_params=case.bench_params,
        method=case.method, method_label=case.method_label, method_params=case.method_params,
        model=case.model, device=case.device, backend=case.backend, threads=case.threads,
        seed=case.seed, status="ok",
    )


def unreported(case: Case, status: str, error_type: str, message: str,
               seconds: float) -> CaseResult:
    """The record of a case whose process or worker died or was killed before it reported."""
    record = case_record(case)
    record.status = status
    record.error = CaseError(type=error_type, message=message, traceback="")
    record.fingerprint = fingerprint(record)
    record.duration_s = round(seconds, 3)
    return record


def run_case(case: Case, load_model, progress: Progress, memo: Memo,
             keep: Callable[[dict], None] = lambda record: None,
             files_dir: Path | None = None, default_threads: int | None = None) -> CaseResult:
    """One case, isolated: any exception becomes status error with its traceback. `memo`: what
    the run's cases share (kvbench.memo); `keep`: where the case's per-sample records go, each
    tagged with the case's id and start time (a rerun case's later records supersede);
    `files_dir`: where the case may keep files (RunContext.files_dir); default_threads: torch
    threads for a case that sets none (default: torch's own)."""
    clock = time.perf_counter()
    record = case_record(case)
    record.started = _now()
    try:
        with _deadline(case.timeout_s):
            torch.set_num_threads(case.threads or default_threads or DEFAULT_THREADS)
            _seed_everything(case.seed, case.backend)
            device = resolve_device(case.device)
            record.device = _device_name(device, case.backend)
            benchmark = BENCHMARKS.get(case.benchmark)()
            params = benchmark.Params(**case.bench_params)
            method = build_method(case.method, case.method_params)
            ctx = RunContext(
                device=device, seed=case.seed, repeats=case.repeats, model=case.model,
                load_model=load_model, status=progress.status, backend=case.backend, memo=memo,
                keep=lambda sample: keep({"case": case.id, "started": record.started, **sample}),
                files_dir=files_dir,
            )
            output = benchmark.run(params, method, ctx)
        record.metrics, record.info, record.comparable = (
            output.metrics, output.info, output.comparable,
        )
        impl_log = getattr(method, "impl_log", None)  # which implementation ran (kvbench.kernels)
        if impl_log is not None and impl_log.ran:
            record.info["impl"] = impl_log.summary()
        record.claims = _judge_own(case.claims, output.metrics)
        record.warnings = [f"metric {name} is {metric.value} (not finite): its claims fail"
                           for name, metric in output.metrics.items() if not metric.finite()]
    except CaseTimeout as exc:
        record.status = "timeout"
        record.error = CaseError(type="CaseTimeout", message=str(exc), traceback="")
    except Exception as exc:  # noqa: BLE001 - a crashing case must not stop the others
        record.status = "error"
        record.error = CaseError(
            type=type(exc).__name__, message=str(exc), traceback=traceback.format_exc()
        )
    record.fingerprint = fingerprint(record)
    record.duration_s = round(time.perf_counter() - clock, 3)
    return record


class Executor(Protocol):
    """Where a run's cases run. The runner alone writes what they yield."""

    def machine(self, device: str, backend: str) -> tuple[str, dict[str, Any]]:
        """(the device's name, the machine fingerprint) where the cases run."""
        ...

    def run(self, cases: list[Case], progress: Progress, keep: Callable[[dict], None],
            files_dir: Path) -> Iterator[CaseResult]:
        """Each case's record as it finishes (in any order)."""
        ...

    def close(self) -> None: ...


class ThisMachine:
    """Cases run here: the machine is this one, fingerprinted once (the command line asks for
    it before the run, to check a baseline, and the run again, for its header)."""

    _machine: tuple[str, dict[str, Any]] | None = None

    def machine(self, device, backend):
        if self._machine is None:
            name = str(resolve_device(device))
            self._machine = name, machine_fingerprint(name, backend)
        return self._machine


class InProcess(ThisMachine):
    """Cases one after another in this process, sharing loaded models and the run's Memo."""

    def __init__(self):
        self.load_model, self.memo = _ModelCache(), Memo()

    def run(self, cases, progress, keep, files_dir):
        for case in cases:
            progress.case_started(case)
            yield run_case(case, self.load_model, progress, self.memo, keep, files_dir)

    def close(self):
        self.memo.close()


class ChildProcesses(ThisMachine):
    """Each case in a fresh child process (kvbench.isolation)."""

    def run(self, cases, progress, keep, files_dir):
        from kvbench.isolation import run_case_in_child

        for case in cases:
            progress.case_started(case)
            yield run_case_in_child(case, progress.status, keep, files_dir)

    def close(self):
        pass


_HELD: set[Path] = set()  # folders this process holds: run_suite inside the CLI's hold is fine


@contextmanager
def hold_out_dir(out_dir: Path):
    """Hold `out_dir` for this run: another run into it is refused at once (OutDirBusy). The
    lock is an flock, which the kernel drops when the process ends, so a crashed or killed run
    leaves no stuck lock behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key = out_dir.resolve()
    if fcntl is None or key in _HELD:
        yield
        return
    handle = open(out_dir / LOCK, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process"
        handle.close()
        raise OutDirBusy(f"{out_dir} is in use by another kvbench run ({holder}); wait for it "
                         "to finish or use another --out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, since {_now()}\n")
    handle.flush()
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        handle.close()  # releases the lock


def _archive_previous(out_dir: Path) -> None:
    """Move an earlier run's files aside instead of overwriting them."""
    names = [name for name in (JSONL, JSON, PREDICTIONS, "report.md")
             if (out_dir / name).exists()]
    if not names:
        return
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    archive, n = out_dir / "previous" / stamp, 1
    while archive.exists():  # two runs in one second must not share (and overwrite) a folder
        n += 1
        archive = out_dir / "previous" / f"{stamp}-{n}"
    archive.mkdir(parents=True)
    for name in names:
        (out_dir / name).rename(archive / name)


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
    changed = [f"{key} {header.settings.get(key)!r} then, {value!r} now"
               for key, value in settings.items() if header.settings.get(key) != value]
    if changed:
        raise ResumeError(f"{path} was run with other settings ({'; '.join(changed)}); resume "
                          "with the same --device, --backend and --repeats, or use another --out")
    cases = jsonl.cases
    if header.suite.hash != suite.hash:
        if _measured_part(header.suite.resolved) != _measured_part(suite.resolved):
            raise ResumeError(
                f"{path} was written by a different version of suite {suite.name!r} "
                f"(hash {header.suite.hash[:12]} != {suite.hash[:12]}); run without --resume "
                "or with another --out"
            )
        # Claims judge measurements; they do not change them: judge the finished cases again.
        progress.notice(f"{path}: only the suite's claims changed since this run started; every"
                        " finished case's claims are judged again")
        header = header.model_copy(update={"suite": SuiteRecord(
            name=suite.name, path=suite.path, hash=suite.hash, resolved=suite.resolved)})
        claims = {case.id: case.claims for case in suite.cases}
        for record in cases:
            if record.status == "ok":
                record.claims = _judge_own(claims.get(record.id, []), record.metrics)
    if jsonl.torn_tail:
        # A kill mid-write cut the last line: drop it so the next append starts clean.
        size = path.stat().st_size
        with open(path, "r+b") as fh:
            fh.truncate(size - len(jsonl.torn_tail))
        cut = re.search(r'"id":"([^"]+)"', jsonl.torn_tail.decode("utf-8", errors="replace"))
        what = f"case {cut.group(1)!r}" if cut else "a case"
        progress.notice(f"{path}: the last line was cut mid-write ({what}); it is dropped and "
                        "that case runs again")
    return header, cases


def _measured_part(resolved: dict[str, Any]) -> str:
    """A resolved suite without its claims, as canonical JSON: what decides the measurements."""
    plain = json.loads(json.dumps(resolved, default=str))
    for entry in plain.get("methods", []) + plain.get("benchmarks", []):
        entry.pop("claims", None)
    return json.dumps(plain, sort_keys=True)


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
) -> RunOutcome:
    """Run `cases` (default: all of the suite's) into out_dir.

    Every finished case is appended to results.jsonl and fsynced before the next starts;
    results.json is written at the end, and also when interrupted (then `interrupted` is set
    and KeyboardInterrupt is raised again for the caller to report). repeats_override is the
    command line's --repeats, recorded so that --resume can insist on it. shard: run only its
    part of `cases` (kvbench.shard); the header keeps all of `cases` as planned, for `kvbench
    merge` to find what no shard ran. isolate: each case in a fresh child process
    (kvbench.isolation); executor: where the cases run (default in this process, or as isolate
    says); the caller closes an executor it passes.
    """
    out_dir = Path(out_dir)
    progress = progress or _Silent()
    planned = suite.cases if cases is None else cases
    cases = planned if shard is None else select_shard(suite.cases, planned, shard)
    device = planned[0].device if planned else "cpu"
    backend = planned[0].backend if planned else "torch"
    own = executor is None
    executor = executor or (ChildProcesses() if isolate else InProcess())
    try:
        return _run_suite(suite, out_dir, cases, planned, resume, progress, repeats_override,
                          executor, shard, device, backend)
    finally:
        if own:
            executor.close()


def _run_suite(suite, out_dir, cases, planned, resume, progress, repeats_override, executor,
               shard, device, backend) -> RunOutcome:
    device_name, machine = executor.machine(device, backend)
    if shard is not None and not cases:
        progress.notice(f"shard {shard} holds none of the {len(planned)} case(s); an empty run "
                        "is written, for `kvbench merge`")
    settings = {"device": device_name, "backend": backend, "repeats": repeats_override,
                "shard": shard and str(shard)}
    with hold_out_dir(out_dir):
        finished: list[CaseResult] = []
        if resume and (out_dir / JSONL).exists():
            header, finished = _resume_state(out_dir, suite, settings, progress)
        else:
            _archive_previous(out_dir)
            header = RunHeader(
                kvbench_version=__version__, git_sha=git_sha(Path(suite.path).parent),
                machine=machine,
                suite=SuiteRecord(
                    name=suite.name, path=suite.path, hash=suite.hash, resolved=suite.resolved
                ),
                settings=settings,
                planned=[c.id for c in planned],
                started=_now(),
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
    records = executor.run(todo, progress, keep, out_dir / FILES)
    try:
        for record in records:
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


def _judge_own(claims: list, metrics: dict) -> list:
    """Verdicts of the claims on a case's own metrics; claims against another case are judged
    when the run finishes (judge_across)."""
    return [judge(claim, metrics) for claim in claims if claim.reference is None]


def judge_across(result: RunResult, cases: list[Case]) -> None:
    """Adds to each finished case the verdicts of its claims against another case of the run
    (`metric / LABEL op value`): missing when that case did not run or did not finish ok."""
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
            metrics = other.metrics if other is not None and other.status == "ok" else None
            record.claims.append(judge(claim, record.metrics, metrics, other_id))


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
    result.finished = _now()
    try:
        save_results(out_dir / JSON, result)
    except OSError as exc:
        if strict:
            raise ResultsNotWritten(
                exc.errno, f"cannot write {out_dir / JSON}: {exc.strerror or exc}; every finished "
                           f"case is in {out_dir / JSONL} (`kvbench report` reads it)") from exc
