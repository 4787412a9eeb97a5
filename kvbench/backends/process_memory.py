"""The process's resident memory and its high-water mark, which Linux resets when 5 is written
to /proc/self/clear_refs: a true per-case peak on CPU without a fresh process per case."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
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


# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# heap "release": a freed block of this size or more goes back to the system at once (glibc maps
# each such block on its own), so the resident peak counts the blocks in use, as CUDA's
# allocated peak does; "keep" after "release": the fixed thresholds glibc's own adjustment
# reaches after large frees (its mmap threshold rises up to 32 MiB, the trim threshold to twice
# it), as near as the default can be restored
RELEASED_BLOCK_BYTES = 1 << 20
KEPT_MMAP_THRESHOLD = 32 << 20
GLIBC_TRIM_THRESHOLD = 128 << 10  # its default: the heap's free top beyond this is given back
HEAP_MODES = ("keep", "release")
_heap = "keep"


@functools.cache  # find_library runs ldconfig: once a process, not at every case's reset
def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def _release_freed_memory() -> None:
    """Hand memory freed by earlier work back to the OS, so it is not counted as this work's:
    Python's garbage, then glibc's free heap pages (tensors below its mmap threshold live there)."""
    gc.collect()
    _free_heap_pages()


def _free_heap_pages() -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def trim_heap() -> None:
    """With the heap released, give back the free pages inside it too (glibc's malloc_trim):
    small blocks freed between long-lived ones (a packed segment, a decoded part) leave holes no
    threshold returns, tens of MB over a long context (temporal decay's overhead at 8k: 148 MB
    left, 89 MB trimmed at each forward's end); kept: nothing (its blocks are kept by choice)."""
    if _heap == "release":
        _free_heap_pages()


def set_heap(mode: str) -> bool:
    """What glibc does with a freed block of RELEASED_BLOCK_BYTES or more from now on: "keep" it
    for reuse (its default: fast, but the resident peak counts the kept blocks until they are
    reused, tens to hundreds of MB over a long prefill) or "release" it to the system at once
    (the resident peak counts what is held; the blocks' pages are faulted in again at each
    allocation: 12-21% slower prefills measured). False where the C library has no mallopt
    (not glibc): nothing changed."""
    global _heap
    if mode not in HEAP_MODES:
        raise ValueError(f"cpu_heap must be one of {', '.join(HEAP_MODES)}, not {mode!r}")
    if mode == _heap:
        return True
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    mmap_threshold = RELEASED_BLOCK_BYTES if mode == "release" else KEPT_MMAP_THRESHOLD
    trim_threshold = GLIBC_TRIM_THRESHOLD if mode == "release" else 2 * KEPT_MMAP_THRESHOLD
    if not (libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
            and libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)):
        return False
    _heap = mode
    return True


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
    released = (f"; freed blocks of {RELEASED_BLOCK_BYTES >> 20} MiB or more released at once,"
                " the heap's free pages at each forward's end" if _heap == "release" else "")
    if resettable():
        return f"process resident high-water mark (VmHWM, reset at the start of the case{released})"
    return f"process peak RSS since it started (ru_maxrss; this OS cannot reset it{released})"


def available_bytes() -> int:
    """Memory the machine can still give without swapping (MemAvailable; elsewhere the
    physical memory less this process's peak, a rough bound)."""
    if _MEMINFO.exists():
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(0, physical - high_water())
