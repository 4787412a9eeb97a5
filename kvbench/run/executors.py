"""Where a run's cases run: in this process, or each in a fresh child process (the Ray executor
is kvbench.run.ray_executor). The runner alone writes what they yield."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from kvbench.backends.torch_backend import resolve_device
from kvbench.hardware import fingerprint as machine_fingerprint
from kvbench.memo import Memo
from kvbench.results import CaseResult
from kvbench.run.case import ModelCache, Progress, run_case
from kvbench.run.isolated import run_case_in_child
from kvbench.suite.case import Case


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
        self.load_model, self.memo = ModelCache(), Memo()

    def run(self, cases, progress, keep, files_dir):
        cases = list(cases)
        for index, case in enumerate(cases):
            progress.case_started(case)
            self.memo.later = tuple(cases[index + 1:])
            yield run_case(case, self.load_model, progress, self.memo, keep, files_dir)

    def close(self):
        self.memo.close()


class ChildProcesses(ThisMachine):
    """Each case in a fresh child process (kvbench.run.isolated)."""

    def run(self, cases, progress, keep, files_dir):
        for case in cases:
            progress.case_started(case)
            yield run_case_in_child(case, progress, keep, files_dir)

    def close(self):
        pass
