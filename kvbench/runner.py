"""Runs expanded cases: isolation, per-case timeout, fixed seeds, results.jsonl and --resume."""
from __future__ import annotations

import random
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from kvbench import __version__
from kvbench.backends.torch_backend import resolve_device
from kvbench.benchmarks import BENCHMARKS, RunContext
from kvbench.claims import judge
from kvbench.hardware import fingerprint, git_sha
from kvbench.methods.base import build_method
from kvbench.results import (
    CaseError, CaseResult, RunHeader, RunResult, SuiteRecord, append_jsonl, case_line,
    header_line, read_jsonl, save_results,
)
from kvbench.suite.case import Case, LoadedSuite

JSONL = "results.jsonl"
JSON = "results.json"


class ResumeError(ValueError):
    """The folder holds results that cannot be resumed with this suite."""


class CaseTimeout(Exception):
    pass


class Progress(Protocol):
    def start(self, total: int, skipped: int) -> None: ...
    def case_started(self, case: Case) -> None: ...
    def status(self, text: str) -> None: ...
    def case_finished(self, result: CaseResult) -> None: ...
    def stop(self) -> None: ...


class _Silent:
    def start(self, total, skipped): ...
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


def run_case(case: Case, load_model, progress: Progress) -> CaseResult:
    """One case, isolated: any exception becomes status error with its traceback."""
    started, clock = _now(), time.perf_counter()
    record = CaseResult(
        id=case.id, benchmark=case.benchmark, bench_params=case.bench_params,
        method=case.method, method_label=case.method_label, method_params=case.method_params,
        model=case.model, device=case.device, backend=case.backend, seed=case.seed, status="ok",
        started=started,
    )
    try:
        with _deadline(case.timeout_s):
            _seed_everything(case.seed, case.backend)
            device = resolve_device(case.device)
            record.device = _device_name(device, case.backend)
            benchmark = BENCHMARKS.get(case.benchmark)()
            params = benchmark.Params(**case.bench_params)
            method = build_method(case.method, case.method_params)
            ctx = RunContext(
                device=device, seed=case.seed, repeats=case.repeats, model=case.model,
                load_model=load_model, status=progress.status, backend=case.backend,
            )
            output = benchmark.run(params, method, ctx)
        record.metrics, record.info, record.comparable = (
            output.metrics, output.info, output.comparable,
        )
        record.claims = [judge(claim, output.metrics) for claim in case.claims]
    except CaseTimeout as exc:
        record.status = "timeout"
        record.error = CaseError(type="CaseTimeout", message=str(exc), traceback="")
    except Exception as exc:  # noqa: BLE001 - a crashing case must not stop the others
        record.status = "error"
        record.error = CaseError(
            type=type(exc).__name__, message=str(exc), traceback=traceback.format_exc()
        )
    record.duration_s = round(time.perf_counter() - clock, 3)
    return record


def _archive_previous(out_dir: Path) -> None:
    """Move an earlier run's files aside instead of overwriting them."""
    names = [name for name in (JSONL, JSON, "report.md") if (out_dir / name).exists()]
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


def _drop_torn_line(path: Path) -> None:
    """A kill mid-write can leave half a line; cut it so the next append starts clean."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)


def _resume_state(out_dir: Path, suite: LoadedSuite) -> tuple[RunHeader, list[CaseResult]]:
    _drop_torn_line(out_dir / JSONL)
    header, finished = read_jsonl(out_dir / JSONL)
    if header is None:
        raise ResumeError(f"{out_dir / JSONL} has no header line; cannot resume from it")
    if header.suite.hash != suite.hash:
        raise ResumeError(
            f"{out_dir / JSONL} was written by a different version of suite {suite.name!r} "
            f"(hash {header.suite.hash[:12]} != {suite.hash[:12]}); run without --resume "
            "or with another --out"
        )
    return header, finished


def run_suite(
    suite: LoadedSuite,
    out_dir: str | Path,
    cases: list[Case] | None = None,
    resume: bool = False,
    progress: Progress | None = None,
) -> RunOutcome:
    """Run `cases` (default: all of the suite's) into out_dir.

    Every finished case is appended to results.jsonl and fsynced before the next starts;
    results.json is written at the end, and also when interrupted (then `interrupted` is set
    and KeyboardInterrupt is raised again for the caller to report).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = progress or _Silent()
    cases = suite.cases if cases is None else cases
    device = cases[0].device if cases else "cpu"
    backend = cases[0].backend if cases else "torch"

    finished: list[CaseResult] = []
    if resume and (out_dir / JSONL).exists():
        header, finished = _resume_state(out_dir, suite)
    else:
        _archive_previous(out_dir)
        header = RunHeader(
            kvbench_version=__version__, git_sha=git_sha(Path(suite.path).parent),
            machine=fingerprint(str(resolve_device(device)), backend),
            suite=SuiteRecord(
                name=suite.name, path=suite.path, hash=suite.hash, resolved=suite.resolved
            ),
            started=_now(),
        )
        append_jsonl(out_dir / JSONL, header_line(header))

    done = {c.id for c in finished}
    todo = [c for c in cases if c.id not in done]
    result = RunResult(**header.model_dump(), cases=list(finished))
    load_model = _ModelCache()
    progress.start(total=len(todo), skipped=len(cases) - len(todo))
    try:
        for case in todo:
            progress.case_started(case)
            record = run_case(case, load_model, progress)
            append_jsonl(out_dir / JSONL, case_line(record))
            result.cases.append(record)
            progress.case_finished(record)
    except KeyboardInterrupt:
        result.interrupted = True
        raise
    finally:
        progress.stop()
        order = {c.id: i for i, c in enumerate(suite.cases)}
        result.cases.sort(key=lambda c: order.get(c.id, len(order)))
        result.finished = _now()
        save_results(out_dir / JSON, result)
    return RunOutcome(result=result, out_dir=out_dir, skipped=len(cases) - len(todo))
