"""`kvbench run --gpus all|0,1,...`: one case per GPU at a time on this machine.

Each case runs in a fresh child process (kvbench.run.isolated) that sees one GPU alone: its
CUDA_VISIBLE_DEVICES names that GPU, so the case's `cuda` (or `auto`) is that GPU and nothing
it does can land on another. One thread per GPU takes the next case from a queue ordered by
expected cost, the largest first (kvbench.run.cost), so the long cases do not start last and
leave the other GPUs idle at the end. The records come back to the driver, which alone writes
them (kvbench.run.runner), as from any executor.
"""
from __future__ import annotations

import collections
import os
import queue
import threading
from pathlib import Path
from typing import Callable, Iterator

import torch

from kvbench.results import CaseResult
from kvbench.run.case import DEFAULT_THREADS, VISIBLE_DEVICES, Progress
from kvbench.run.cost import longest_first
from kvbench.run.executors import ThisMachine
from kvbench.run.isolated import run_case_in_child
from kvbench.run.placement import may_use_gpu
from kvbench.suite.case import Case

_POLL_S = 0.5
_JOIN_S = 10.0  # for a GPU's thread to end once its child is killed


def visible_gpu_count() -> int:
    """The CUDA devices torch sees here (after this process's own CUDA_VISIBLE_DEVICES)."""
    return torch.cuda.device_count()


def parse_gpus(text: str, visible: int) -> list[int]:
    """`--gpus`: "all" or comma-separated indices of the visible CUDA devices; ValueError
    naming the option and what this machine has otherwise."""
    has = (f"this machine has {visible} CUDA device(s)" + (f" (0-{visible - 1})" if visible
                                                          else ""))
    if text.strip() == "all":
        if not visible:
            raise ValueError(f"--gpus all: {has}; run without --gpus")
        return list(range(visible))
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"--gpus {text!r}: expected all, or GPU indices such as 0,1,3")
    gpus = [int(part) for part in parts]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {text!r}: a GPU is listed twice")
    missing = [gpu for gpu in gpus if gpu >= visible]
    if missing:
        raise ValueError(f"--gpus {text!r}: no GPU {', '.join(map(str, missing))}; {has}")
    return gpus


def gpu_refusal(cases: list[Case]) -> str | None:
    """Why `cases` cannot run one per GPU (None: they can)."""
    if not any(may_use_gpu(case) for case in cases):
        return ("--gpus runs cases on GPUs, and none of these would use one (their device is "
                "cpu or mps, or their backend mlx); run without --gpus")
    for case in cases:
        if case.device.startswith("cuda:"):
            return (f"--gpus gives each case its GPU, and case {case.id} names {case.device}: "
                    "set its device to cuda or auto (--device cuda), or run without --gpus")
        if may_use_gpu(case) and case.load_options.device_map is not None:
            return (f"--gpus gives each case one GPU, and case {case.id} places its model "
                    "itself (device_map): run it with --executor ray, which gives a case the "
                    "GPUs its device_map names, or without --gpus")
    return None


class LocalGPUs(ThisMachine):
    """Cases side by side, one per GPU of `gpus` (indices of the devices torch sees here), each
    in a child process pinned to its GPU. threads: torch threads of a case that sets none
    (default: this machine's cores shared out among the GPUs)."""

    def __init__(self, gpus: list[int], threads: int | None = None):
        self.gpus = gpus
        self.threads = threads or max(1, DEFAULT_THREADS // len(gpus))
        # the GPUs' own ids when this process is itself pinned to some
        seen = os.environ.get(VISIBLE_DEVICES)
        ids = [part.strip() for part in seen.split(",")] if seen else None
        self.pins = {gpu: ids[gpu] if ids and gpu < len(ids) else str(gpu) for gpu in gpus}

    def run(self, cases: list[Case], progress: Progress, keep: Callable[[dict], None],
            files_dir: Path) -> Iterator[CaseResult]:
        waiting = collections.deque(longest_first(cases))
        taking, keeping = threading.Lock(), threading.Lock()
        finished: queue.Queue = queue.Queue()
        cancel = threading.Event()

        def kept(sample: dict) -> None:  # the slots' per-sample records, one line at a time
            with keeping:
                keep(sample)

        def slot(gpu: int) -> None:
            try:
                while not cancel.is_set():
                    with taking:
                        if not waiting:
                            return
                        case = waiting.popleft()
                    finished.put(self._run_one(case, gpu, progress, kept, files_dir, cancel))
            except BaseException as exc:  # noqa: BLE001 - handed to the driver, which raises it
                finished.put(exc)

        workers = [threading.Thread(target=slot, args=(gpu,), name=f"kvbench gpu {gpu}",
                                    daemon=True) for gpu in self.gpus]
        for worker in workers:
            worker.start()
        try:
            for _ in range(len(cases)):
                item = _next(finished)
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # interrupted, or the driver failed to write: every child is stopped
            cancel.set()
            for worker in workers:
                worker.join(timeout=_JOIN_S)

    def _run_one(self, case: Case, gpu: int, progress: Progress, keep, files_dir: Path,
                 cancel: threading.Event) -> CaseResult:
        pin = self.pins[gpu]
        progress.case_started(case, f"gpu {gpu}")
        record = run_case_in_child(case, _CaseProgress(progress, case.id), keep, files_dir,
                                   env={VISIBLE_DEVICES: pin}, default_threads=self.threads,
                                   cancel=cancel)
        record.info.setdefault("cuda_visible_devices", pin)  # a child that died said nothing
        return record

    def close(self) -> None:
        pass


def _next(finished: queue.Queue):
    """The next finished item; waits in short steps so that Ctrl-C reaches the driver."""
    while True:
        try:
            return finished.get(timeout=_POLL_S)
        except queue.Empty:
            continue


class _CaseProgress:
    """A child's status texts and notices, naming its case among those running side by side."""

    def __init__(self, progress: Progress, case_id: str):
        self.progress, self.case_id = progress, case_id

    def status(self, text: str) -> None:
        self.progress.status(text, self.case_id)

    def notice(self, text: str) -> None:
        self.progress.notice(f"{self.case_id}: {text}")
