"""The process's resident memory and its high-water mark, which Linux resets when 5 is written
to /proc/self/clear_refs: a true per-case peak on CPU without a fresh process per case."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_MEMINFO = Path("/proc/meminfo")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{_STATUS} has no {field}")


def _release_freed_memory() -> None:
    """Hand memory freed by earlier work back to the OS, so it is not counted as this work's:
    Python's garbage, then glibc's free heap pages (tensors below its mmap threshold live there)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def resettable() -> bool:
    """Whether this process's high-water mark can be reset (Linux with /proc)."""
    return _STATUS.exists() and _CLEAR_REFS.exists()


def reset_high_water() -> int:
    """Free what can be freed, reset the high-water mark to the current resident size, and
    return that size in bytes. Without /proc, nothing is reset and the lifetime peak stays."""
    _release_freed_memory()
    if not resettable():
        return high_water()
    _CLEAR_REFS.write_text("5")
    return _status_bytes("VmRSS")


def high_water() -> int:
    """Peak resident bytes since the last reset_high_water() (since the start without /proc)."""
    if resettable():
        return _status_bytes("VmHWM")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def high_water_label() -> str:
    if resettable():
        return "process resident high-water mark (VmHWM, reset at the start of the case)"
    return "process peak RSS since it started (ru_maxrss; this OS cannot reset it)"


def available_bytes() -> int:
    """Memory the machine can still give without swapping (MemAvailable; elsewhere the
    physical memory less this process's peak, a rough bound)."""
    if _MEMINFO.exists():
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(0, physical - high_water())
