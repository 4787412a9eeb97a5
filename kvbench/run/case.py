"""One case, run in this process: isolation from crashes, its timeout, fixed seeds, its record.
What every executor (in process, child process, Ray worker) runs."""
from __future__ import annotations

import os
import random
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from kvbench.backends.process_memory import set_heap
from kvbench.backends.torch_backend import resolve_device
from kvbench.benchmarks import BENCHMARKS, measurement
from kvbench.benchmarks.measure.context import RunContext
from kvbench.benchmarks.specs.base import FOOTPRINT_METRICS
from kvbench.judge.claims import judge
from kvbench.memo import Memo
from kvbench.run.files import now
from kvbench.hub import DownloadProgress
from kvbench.methods import implementation
from kvbench.models.footprint import Reading
from kvbench.models.info import pinned
from kvbench.models.options import LoadOptions, resolved_dtype
from kvbench.results import CaseError, CaseResult, Footprint, Metric, fingerprint
from kvbench.suite.case import Case

DEFAULT_THREADS = torch.get_num_threads()  # torch's default here, before any case sets it
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # what pins a process to some of the GPUs


class CaseTimeout(Exception):
    pass


class Progress(Protocol):
    """What a run shows as it goes. Where cases run side by side (`--gpus`, Ray), each started
    case says where it runs and each status text names its case; otherwise one case runs at a
    time and a status text is that case's."""

    def start(self, total: int, skipped: int) -> None: ...
    def notice(self, text: str) -> None: ...
    def case_started(self, case: Case, where: str | None = None) -> None: ...
    def status(self, text: str, case_id: str | None = None) -> None: ...
    def case_finished(self, result: CaseResult) -> None: ...
    def stop(self) -> None: ...


class Silent:
    """A Progress that shows nothing."""

    def start(self, total, skipped): ...
    def notice(self, text): ...
    def case_started(self, case, where=None): ...
    def status(self, text, case_id=None): ...
    def case_finished(self, result): ...
    def stop(self): ...


@contextmanager
def deadline(seconds: float | None):
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


def seed_everything(seed: int, backend: str = "torch") -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if backend == "mlx":
        import mlx.core as mx

        mx.random.seed(seed)


def device_name(device: torch.device, backend: str) -> str:
    """What ran the case: the torch device, or MLX's default device (torch still makes data)."""
    if backend == "mlx":
        import mlx.core as mx

        return f"mlx:{mx.default_device()}"
    return str(device)


class ModelCache:
    """Loads each model (spec, device, backend, dtype, commit, options) once per run: cases
    share weights, never caches."""

    def __init__(self):
        self._loaded = {}

    def __call__(self, spec: str, device: torch.device, backend: str = "torch",
                 dtype: str = "float32", revision: str | None = None,
                 options: LoadOptions = LoadOptions(),
                 progress: DownloadProgress | None = None):
        key = (spec, str(device), backend, dtype, revision, options.key())
        if key not in self._loaded:
            if backend == "mlx":
                from kvbench.models.mlx_loading import load_mlx_model

                self._loaded[key] = load_mlx_model(spec, None, revision, options.max_context,
                                                   progress)
            else:
                from kvbench.models import load_model

                self._loaded[key] = load_model(spec, device, None, dtype, revision, options,
                                               progress)
        return self._loaded[key]


def unreported(case: Case, status: str, error_type: str, message: str,
               seconds: float) -> CaseResult:
    """The record of a case whose process or worker died or was killed before it reported."""
    record = case.record()
    record.status = status
    record.error = CaseError(type=error_type, message=message, traceback="")
    record.fingerprint = fingerprint(record)
    record.duration_s = round(seconds, 3)
    return record


def judge_own(claims: list, metrics: dict) -> list:
    """Verdicts of the claims on a case's own metrics; claims against another case are judged
    when the run finishes (kvbench.run.runner.judge_across)."""
    return [judge(claim, metrics) for claim in claims if claim.reference is None]


def footprint_metrics(reading: Reading, own: dict[str, Metric]) -> dict[str, Metric]:
    """The footprint's figures as metrics, but those the benchmark reports itself (ladder's
    peak_bytes and weights_bytes, measured since the same reset): its own stand, and the
    overhead is figured from its peak."""
    peak = own["peak_bytes"].value if "peak_bytes" in own else None
    return {name: FOOTPRINT_METRICS[name].of(value)
            for name, value in reading.figures(peak).items() if name not in own}


def run_case(case: Case, load_model, progress: Progress, memo: Memo,
             keep: Callable[[dict], None] = lambda record: None,
             files_dir: Path | None = None, default_threads: int | None = None) -> CaseResult:
    """One case, isolated: any exception becomes status error with its traceback. `memo`: what
    the run's cases share (kvbench.memo); `keep`: where the case's per-sample records go, each
    tagged with the case's id and start time (a rerun case's later records supersede);
    `files_dir`: where the case may keep files (RunContext.files_dir); default_threads: torch
    threads for a case that sets none (default: torch's own)."""
    clock = time.perf_counter()
    record = case.record()
    record.started = now()
    try:
        with deadline(case.timeout_s):
            torch.set_num_threads(case.threads or default_threads or DEFAULT_THREADS)
            seed_everything(case.seed, case.backend)
            device = resolve_device(case.device)
            if device.type == "cpu":  # before the footprint's start is read
                set_heap(case.cpu_heap)
            record.device = device_name(device, case.backend)
            record.model_dtype = resolved_dtype(case.model_dtype, device.type,
                                                case.load_options.checkpoint_dtype)
            benchmark = measurement(BENCHMARKS.get(case.benchmark))
            method = implementation(case.settings, case.backend)
            ctx = RunContext(
                device=device, seed=case.seed, repeats=case.repeats,
                model=case.model and pinned(case.model, case.model_revision),
                model_dtype=record.model_dtype, model_revision=case.model_revision,
                load_options=case.load_options, chat=case.chat,
                load_model=load_model, status=progress.status, notice=progress.notice,
                backend=case.backend, memo=memo,
                keep=lambda sample: keep({"case": case.id, "started": record.started, **sample}),
                files_dir=files_dir, footprint_of=method,
            )
            try:
                output = benchmark.run(case.params, method, ctx)
                reading = ctx.footprint.close() if ctx.footprint else None  # as the work ends
            finally:
                if ctx.footprint is not None:
                    ctx.footprint.stop()
        record.metrics, record.info, record.comparable = (
            dict(output.metrics), output.info, output.comparable,
        )
        if reading:
            added = footprint_metrics(reading, output.metrics)
            record.metrics.update(added)
            record.footprint = Footprint(probe=reading.probe, metrics=list(added))
        impl = {}  # which implementation ran (kvbench.kernels), and the prompt's attention
        if method.impl_log is not None:
            impl.update(method.impl_log.summary())
        if ctx.loaded is not None:
            impl["prefill_attention"] = ctx.loaded.prefill_attention
        if impl:
            record.info["impl"] = impl
        benchmark.record.check(record.info)  # a key its record does not declare: a bug here
        record.claims = judge_own(case.claims, record.metrics)
        record.warnings = [f"metric {name} is {metric.value} (not finite): its claims fail"
                           for name, metric in record.metrics.items() if not metric.finite()]
    except CaseTimeout as exc:
        record.status = "timeout"
        record.error = CaseError(type="CaseTimeout", message=str(exc), traceback="")
    except Exception as exc:  # noqa: BLE001 - a crashing case must not stop the others
        record.status = "error"
        record.error = CaseError(
            type=type(exc).__name__, message=str(exc), traceback=traceback.format_exc()
        )
    visible = os.environ.get(VISIBLE_DEVICES)
    if visible is not None:  # the GPUs this process was pinned to, whatever became of the case
        record.info["cuda_visible_devices"] = visible
    record.fingerprint = fingerprint(record)
    record.duration_s = round(time.perf_counter() - clock, 3)
    return record
