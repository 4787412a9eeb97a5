"""`kvbench run --executor ray`: each case runs as a Ray task, on a local Ray or on a cluster
(`--address`); the driver alone writes results.

A task asks for the resources its case needs. A CPU case asks for `threads` CPUs; one that sets
no `threads` runs on torch's default number here, the driver's (`default_threads`), and asks for
as many CPUs: the float results of a case depend on its thread count, and so are the same as in
a local run. A GPU case (device cuda, or auto on a cluster that has GPUs) asks for one GPU, or
for as many as its model's device_map spreads it over (kvbench.run.placement), and for
`cpus_per_gpu` CPUs per GPU (its torch threads) unless it sets `threads`: a GPU case leaves the
node's other cores to the cases on its other GPUs. Ray pins a GPU task's process to its GPUs
(CUDA_VISIBLE_DEVICES), which the case records. CPU workers are reused, so each loads a model
once and keeps it for its later cases; a GPU task has a fresh worker (Ray's own default for
them), whose CUDA is made for the GPUs Ray gave it and no others. Each case gets a fresh Memo
(kvbench.memo), closed when it ends: what cases share in a local run (a tokenised text, a
started server) is made again per case here, and nothing outlives its case on a worker. The
task sends back its record, its per-sample records and the files it kept; the driver writes
them as for a local case.

A tracker actor hears when each case starts on a worker. From then the driver holds the case to
its timeout plus GRACE_S (the worker's own SIGALRM record is the better one when it can make it),
and then cancels the task, which kills its worker. A worker that dies mid-case (killed, out of
memory, its node lost) costs one retry; the second death is recorded as an error naming both.
A case no live node can hold is recorded as an error instead of waiting forever.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from kvbench.memo import Memo
from kvbench.results import CaseResult
from kvbench.run.case import DEFAULT_THREADS, ModelCache, Silent, run_case, unreported
from kvbench.run.cost import longest_first
from kvbench.run.executors import ThisMachine
from kvbench.run.placement import WHOLE_NODE, gpus_named, gpus_needed
from kvbench.suite.case import Case

INSTALL_HINT = "pip install 'kvbench[ray]'"
GRACE_S = 30.0
RETRIES = 1  # a case whose worker died runs once more
CPUS_PER_GPU = 2  # a GPU case's CPUs (per GPU) when its suite sets no threads
_POLL_S = 0.25
_FEASIBLE_EVERY_S = 5.0


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached or cannot run the cases."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}"
                             ) from None
    return ray


def _shape(gpus: int, cpus: int) -> dict[str, float]:
    """The Ray resources a case asks for."""
    return {"num_cpus": cpus, "num_gpus": gpus}


def _fits(shape: dict[str, float], nodes: list[dict]) -> bool:
    return any(node.get("Alive") and node["Resources"].get("CPU", 0) >= shape["num_cpus"]
               and node["Resources"].get("GPU", 0) >= shape["num_gpus"] for node in nodes)


@dataclass
class _Attempt:
    case: Case
    number: int
    submitted: float
    started: float | None = None
    node: str = ""
    pid: int | None = None
    timed_out: bool = False
    earlier: list[str] = field(default_factory=list)  # why earlier attempts ended


def ray_refusal(cases: list[Case]) -> str | None:
    """Why `cases` cannot run on Ray (None: they can): a case's GPUs are those Ray gives it,
    numbered from 0 in its process."""
    for case in cases:
        if case.device.startswith("cuda:"):
            return (f"on Ray a case runs on the GPU Ray gives it, and case {case.id} names "
                    f"{case.device}: set its device to cuda or auto (--device cuda)")
        named = gpus_named(case.load_options)
        if named and max(named) >= len(named):
            return (f"on Ray a case's GPUs are those Ray gives it, numbered from 0, and case "
                    f"{case.id}'s device_map or max_memory names GPU(s) "
                    f"{', '.join(map(str, sorted(named)))}: number them 0 to {len(named) - 1}")
    return None


class RayExecutor:
    """Runs cases as Ray tasks. Connects to `address` (a running cluster, "auto" for the one
    `ray start` made here), or starts a local Ray with `num_cpus` (default: every core) that
    close() stops. cpus_per_gpu: what a GPU case that sets no `threads` asks for per GPU."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 grace_s: float = GRACE_S, default_threads: int | None = None,
                 status: Callable[[str], None] = lambda text: None,
                 cpus_per_gpu: int = CPUS_PER_GPU):
        self.ray = ray = import_ray()
        self.grace_s = grace_s
        self.default_threads = default_threads or DEFAULT_THREADS
        self.cpus_per_gpu = cpus_per_gpu
        self.owns = not ray.is_initialized()
        if self.owns:
            status("starting Ray" if address is None else f"connecting to Ray at {address}")
            try:
                # "local": a new Ray here, never a cluster an earlier `ray start` left behind
                ray.init(address=address or "local",
                         num_cpus=num_cpus if address is None else None,
                         include_dashboard=False, log_to_driver=False,
                         logging_level=logging.ERROR)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RayUnavailable(f"cannot start or reach Ray ({address or 'local'}): {exc}"
                                     ) from None
        self._remote = ray.remote(max_retries=0, max_calls=0)(_run_on_worker)
        # a fresh worker per GPU case: CUDA, once made in a process, keeps its first GPUs
        self._remote_gpu = ray.remote(max_retries=0, max_calls=1)(_run_on_worker)
        self._gpus_present = ray.cluster_resources().get("GPU", 0) > 0
        self._tracker = ray.remote(num_cpus=0)(_Tracker).remote()
        self._machine: tuple[str, dict[str, Any]] | None = None
        self._heard: dict[str, tuple[str, int]] = {}  # starts not yet matched to an attempt

    def machine(self, device: str, backend: str) -> tuple[str, dict[str, Any]]:
        """Asked of a worker: the driver may have no GPU, or be another kind of machine."""
        if self._machine is None:
            on_gpu = backend == "torch" and (device.startswith("cuda") or (
                device == "auto" and self._gpus_present))
            shape = _shape(int(on_gpu), 1)  # the probe only reads the machine
            self._check_fits(shape, f"a {device} case")
            probe = self.ray.remote(max_retries=1, max_calls=1)(_probe_machine)
            self._machine = self.ray.get(probe.options(**shape).remote(device, backend))
        return self._machine

    def run(self, cases: list[Case], progress, keep: Callable[[dict], None],
            files_dir: Path) -> Iterator[CaseResult]:
        refusal = ray_refusal(cases)
        if refusal:
            raise RayUnavailable(refusal)
        for shape in {tuple(self._shape(case).items()) for case in cases}:
            self._check_fits(dict(shape), "its cases (a suite's `threads`, or --cpus-per-gpu "
                                          "for a GPU case, sets the CPUs a case asks for)")
        pending: dict[Any, _Attempt] = {}
        for case in longest_first(cases):  # Ray starts them about in this order
            self._submit(pending, _Attempt(case, 1, time.monotonic()))
        checked = time.monotonic()
        try:
            while pending:
                ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
                self._note_starts(pending, progress)  # first: a dead worker's pid names it
                for ref in ready:
                    attempt = pending.pop(ref)
                    record = self._collect(ref, attempt, pending, keep, files_dir)
                    if record is not None:
                        yield record
                self._enforce_timeouts(pending)
                if time.monotonic() - checked > _FEASIBLE_EVERY_S:
                    checked = time.monotonic()
                    yield from self._drop_infeasible(pending)
        finally:  # interrupted, or the driver failed to write: nothing is left running
            for ref in pending:
                self.ray.cancel(ref, force=True)

    def close(self) -> None:
        try:
            self.ray.kill(self._tracker)
        except Exception:  # noqa: BLE001 - the cluster may be gone; nothing left to free
            pass
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()

    # ------------------------------------------------------------ driver side

    def _submit(self, pending: dict, attempt: _Attempt) -> None:
        case = attempt.case
        shape = self._shape(case)
        remote = self._remote_gpu if shape["num_gpus"] else self._remote
        ref = remote.options(**shape).remote(case, attempt.number, self._tracker,
                                             int(shape["num_cpus"]))
        pending[ref] = attempt

    def _collect(self, ref, attempt: _Attempt, pending: dict, keep,
                 files_dir: Path) -> CaseResult | None:
        """The attempt's record; None when the case was submitted again."""
        try:
            payload = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            if isinstance(exc, self.ray.exceptions.RayTaskError):  # raised outside run_case
                return _failed(attempt, "error", type(exc.cause).__name__, str(exc.cause))
            if attempt.timed_out:
                return _failed(attempt, "timeout", "CaseTimeout",
                               f"case exceeded its timeout of {attempt.case.timeout_s:g} s and "
                               f"did not stop; its Ray worker was killed after "
                               f"{time.monotonic() - attempt.started:.0f} s")
            reason = _death(exc, attempt)
            if attempt.number <= RETRIES:
                self._submit(pending, _Attempt(attempt.case, attempt.number + 1,
                                               time.monotonic(), earlier=[*attempt.earlier,
                                                                          reason]))
                return None
            return _failed(attempt, "error", "WorkerDied", "; ".join(
                f"attempt {i}: {why}" for i, why in enumerate([*attempt.earlier, reason], 1)))
        record_json, samples, files, worker_dir = payload
        # Paths the case wrote into its worker folder now name the run's files folder.
        moved = json.dumps(str(files_dir))[1:-1]
        there = json.dumps(worker_dir)[1:-1]
        record = CaseResult.model_validate_json(record_json.replace(there, moved))
        for name, data in files.items():
            target = files_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        for sample in samples:
            keep(json.loads(json.dumps(sample).replace(there, moved)))
        record.info["ray"] = {"node": attempt.node, "pid": attempt.pid,
                              "attempt": attempt.number}
        record.warnings.extend(f"attempt {i}: {why}; run again"
                               for i, why in enumerate(attempt.earlier, start=1))
        return record

    def _note_starts(self, pending: dict, progress) -> None:
        self._heard.update(self.ray.get(self._tracker.starts.remote()))
        for attempt in pending.values():
            key = f"{attempt.case.id}#{attempt.number}"
            if attempt.started is None and key in self._heard:
                attempt.node, attempt.pid = self._heard.pop(key)
                attempt.started = time.monotonic()
                progress.case_started(attempt.case, f"ray {attempt.node}")

    def _enforce_timeouts(self, pending: dict) -> None:
        now = time.monotonic()
        for ref, attempt in pending.items():
            limit = attempt.case.timeout_s
            if (limit is not None and attempt.started is not None and not attempt.timed_out
                    and now - attempt.started > limit + self.grace_s):
                attempt.timed_out = True
                self.ray.cancel(ref, force=True)

    def _drop_infeasible(self, pending: dict) -> Iterator[CaseResult]:
        """Cases not yet started that no live node can hold (their nodes left) end as errors."""
        nodes = self.ray.nodes()
        for ref, attempt in list(pending.items()):
            shape = self._shape(attempt.case)
            if attempt.started is None and not _fits(shape, nodes):
                self.ray.cancel(ref, force=True)
                del pending[ref]
                yield _failed(attempt, "error", "NoWorker",
                              f"no live node of the Ray cluster has {_describe(shape)}")

    def _shape(self, case: Case) -> dict[str, float]:
        gpus = gpus_needed(case, self._gpus_present)
        if gpus == WHOLE_NODE:  # a device_map over every GPU it sees: a whole node's
            gpus = max((node["Resources"].get("GPU", 0) for node in self.ray.nodes()
                        if node.get("Alive")), default=1)
        cpus = case.threads or (self.cpus_per_gpu * gpus if gpus else self.default_threads)
        return _shape(int(gpus), cpus)

    def _check_fits(self, shape: dict[str, float], what: str) -> None:
        if not _fits(shape, self.ray.nodes()):
            raise RayUnavailable(f"no node of the Ray cluster has {_describe(shape)} for {what}"
                                 f" (cluster: {self.ray.cluster_resources()})")


def _describe(shape: dict[str, float]) -> str:
    text = f"{shape['num_cpus']:g} CPU(s)"
    return text + (f" and {shape['num_gpus']:g} GPU(s)" if shape["num_gpus"] else "")


def _death(exc: Exception, attempt: _Attempt) -> str:
    where = f" on {attempt.node} (pid {attempt.pid})" if attempt.pid else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"its Ray worker{where} died ({type(exc).__name__}: {first})"


def _failed(attempt: _Attempt, status: str, kind: str, message: str) -> CaseResult:
    seconds = time.monotonic() - (attempt.started or attempt.submitted)
    record = unreported(attempt.case, status, kind, message, seconds)
    record.info["ray"] = {"node": attempt.node, "pid": attempt.pid, "attempt": attempt.number}
    return record


class _Tracker:
    """Hears which attempt started where (an actor: tasks tell it, the driver asks it)."""

    def __init__(self):
        self._new: dict[str, tuple[str, int]] = {}

    def started(self, key: str, node: str, pid: int) -> None:
        self._new[key] = (node, pid)

    def starts(self) -> dict[str, tuple[str, int]]:
        """The starts heard since the last call."""
        new, self._new = self._new, {}
        return new


# ------------------------------------------------------------ worker side

_MODELS = None  # this worker's loaded models, kept for its later cases


def _run_on_worker(case: Case, attempt: int, tracker, threads: int
                   ) -> tuple[str, list[dict], dict, str]:
    import ray

    global _MODELS
    # Waited for: a worker that dies at once must still be named in the driver's record.
    ray.get(tracker.started.remote(f"{case.id}#{attempt}", ray.util.get_node_ip_address(),
                                   os.getpid()))
    _MODELS = _MODELS or ModelCache()
    samples: list[dict] = []
    folder = Path(tempfile.mkdtemp(prefix="kvbench-case-"))
    memo = Memo()
    try:
        record = run_case(case, _MODELS, Silent(), memo, samples.append, folder,
                          default_threads=threads)
    finally:
        memo.close()
    files = {str(path.relative_to(folder)): path.read_bytes()
             for path in folder.rglob("*") if path.is_file()}
    shutil.rmtree(folder, ignore_errors=True)
    return record.model_dump_json(), samples, files, str(folder)


def _probe_machine(device: str, backend: str) -> tuple[str, dict[str, Any]]:
    return ThisMachine().machine(device, backend)
