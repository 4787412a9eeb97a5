"""Runs one case in a fresh child process (`kvbench run --isolate`): a segfault, an
out-of-memory kill or a hang in native code that SIGALRM cannot interrupt costs that case only,
and each case's memory starts from a clean process. The child sends its progress text, its
per-sample records and its result back through a pipe; the parent writes them as for a case run
in-process."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from kvbench.memo import Memo
from kvbench.results import CaseResult
from kvbench.run.case import ModelCache, Progress, run_case, unreported
from kvbench.suite.case import Case

# Past the case's own timeout (which the child enforces with SIGALRM), how long the parent waits
# before it kills the child: the child's own timeout record is the better one when it can make it.
GRACE_S = 30.0
STARTUP_S = 300.0  # for the child to import kvbench and torch before its case's clock starts
_POLL_S = 0.5


def run_case_in_child(case: Case, progress: Progress, keep: Callable[[dict], None],
                      files_dir: Path | None = None, env: dict[str, str] | None = None,
                      default_threads: int | None = None,
                      cancel: threading.Event | None = None) -> CaseResult:
    """The case's record, as kvbench.run.case.run_case makes it, from a spawned process; an error
    or timeout record naming what happened when the process died or hung. The child's status
    texts and notices go to `progress`. env: variables set for the child alone (the GPU it is
    pinned to); default_threads: its torch threads if the case sets none; cancel: when set, the
    child is killed and an error record returned (the run is being stopped)."""
    context = multiprocessing.get_context("spawn")  # no state inherited from this process
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(case, send, files_dir, default_threads),
                            name=f"kvbench case {case.id}", daemon=True)
    spawned = time.monotonic()
    with _environment(env or {}):
        child.start()
    send.close()  # the child holds the only writer: EOF here means it is gone
    # until the child says its case started, it has STARTUP_S; then the case's timeout + grace
    started, limit = spawned, STARTUP_S
    record = None
    try:
        while record is None:
            if limit is not None and time.monotonic() - started > limit:
                break
            if cancel is not None and cancel.is_set():
                return unreported(case, "error", "Cancelled", "the run was stopped",
                                  time.monotonic() - started)
            if not receive.poll(_POLL_S):
                continue
            try:
                kind, payload = receive.recv()
            except EOFError:
                break
            if kind == "started":
                started = time.monotonic()
                limit = None if case.timeout_s is None else case.timeout_s + GRACE_S
            elif kind in ("status", "notice"):
                getattr(progress, kind)(payload)
            elif kind == "keep":
                keep(payload)
            else:
                record = CaseResult.model_validate_json(payload)
    finally:
        child.join(timeout=5 if record is not None else 0)
        if child.is_alive():
            child.kill()
            child.join()
        receive.close()
    seconds = time.monotonic() - started
    return record or _died(case, child.exitcode, seconds, limit, started == spawned)


def _died(case: Case, exitcode: int | None, seconds: float, limit: float | None,
          never_started: bool) -> CaseResult:
    if limit is not None and seconds > limit:
        message = (f"the case's process did not start within {STARTUP_S:g} s" if never_started
                   else f"case exceeded its timeout of {case.timeout_s:g} s and did not stop;"
                        f" its process was killed after {seconds:.0f} s")
        return unreported(case, "timeout", "CaseTimeout", message, seconds)
    if exitcode is not None and exitcode < 0:
        how = f"was killed by {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with status {exitcode} before reporting"
    return unreported(case, "error", "ProcessDied", f"the case's process {how}", seconds)


class _PipeProgress:
    """The child's progress: the current case's status texts and notices go back to the
    parent."""

    def __init__(self, send):
        self.send = send

    def status(self, text: str) -> None:
        self.send.send(("status", text))

    def notice(self, text: str) -> None:
        self.send.send(("notice", text))


# A spawned child takes the environment as it is when it starts: starts that set variables for
# their child alone (the local GPU executor's, one thread per GPU) take turns.
_ENVIRONMENT = threading.Lock()


@contextmanager
def _environment(env: dict[str, str]):
    with _ENVIRONMENT:
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _child(case: Case, send, files_dir: Path | None, default_threads: int | None) -> None:
    progress = _PipeProgress(send)
    send.send(("started", None))
    memo = Memo()
    try:
        record = run_case(case, ModelCache(), progress, memo,
                          lambda sample: send.send(("keep", sample)), files_dir,
                          default_threads)
    finally:
        memo.close()
    send.send(("result", record.model_dump_json()))
    send.close()
