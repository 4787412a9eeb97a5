"""A run's output folder: the files it holds, the lock that keeps it to one run at a time, and
an earlier run's files moved aside (torch-free: merge and report use the names too)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; two runs into one folder are not caught
    fcntl = None

JSONL = "results.jsonl"
JSON = "results.json"
REPORT = "report.md"
PREDICTIONS = "predictions.jsonl"  # per-sample records benchmarks keep (RunContext.keep)
FILES = "files"  # files cases keep beside the results (RunContext.files_dir: server logs)
LOCK = ".kvbench.lock"


class OutDirBusy(RuntimeError):
    """Another run is writing into the output folder."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    handle.write(f"pid {os.getpid()}, since {now()}\n")
    handle.flush()
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        handle.close()  # releases the lock


def archive_previous(out_dir: Path) -> None:
    """Move an earlier run's files aside instead of overwriting them."""
    names = [name for name in (JSONL, JSON, PREDICTIONS, REPORT)
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


