"""MLX synchronisation before timer reads, peak-memory probes, and which BLAS MLX's CPU path uses.

MLX is lazy: nothing is computed until an array is evaluated, so a clock read before mx.eval
times graph building, not the work. timed() evaluates what fn returns (any tree of arrays) and
drains the stream before each clock read.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx

# Shared-library names of BLAS implementations, most specific first. The netlib reference BLAS is
# plain "libblas" (pip's mlx[cpu] wheel ships it as libblas-<hash>.so.3); it is slow.
_BLAS_NAMES = (
    ("openblas", "OpenBLAS"),
    ("mkl_rt", "MKL"),
    ("libmkl", "MKL"),
    ("blis", "BLIS"),
    ("flexiblas", "FlexiBLAS"),
    ("accelerate", "Accelerate"),
    ("veclib", "Accelerate"),
    ("libblas", "reference BLAS (netlib)"),
)


def synchronize(*arrays: Any) -> None:
    """Evaluate `arrays` (trees allowed) and wait until the default stream is idle."""
    if arrays:
        mx.eval(*arrays)
    mx.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(result, seconds) of fn(), with the result evaluated before the second clock read."""
    synchronize()
    start = time.perf_counter()
    result = fn()
    synchronize(result)
    return result, time.perf_counter() - start


def reset_peak_memory() -> int:
    """Reset the allocator's peak; return the bytes its arrays hold now."""
    mx.clear_cache()
    mx.reset_peak_memory()
    return int(mx.get_active_memory())


def free_memory() -> int:
    """Bytes MLX can still allocate: the recommended working set less what its arrays hold on
    a Metal device; on the CPU, the machine's available memory."""
    from kvbench.backends.process_memory import available_bytes

    if mx.metal.is_available():
        limit = mx.metal.device_info()["max_recommended_working_set_size"]
        return max(0, int(limit) - int(mx.get_active_memory()))
    return available_bytes()


def peak_memory_bytes() -> int:
    """Peak bytes MLX's allocator has held since the last reset_peak_memory() (arrays only, on the
    CPU device too; not the process's other memory)."""
    return int(mx.get_peak_memory())


def blas_info() -> tuple[str, bool]:
    """(BLAS library name, is_reference_blas) behind MLX's CPU matmuls, from the shared libraries
    MLX's own binaries link (`ldd` on Linux, `otool -L` on macOS; failing that, the libraries this
    process mapped from MLX's install folders). Only MLX's dependencies count: numpy or torch may
    have loaded another BLAS into the same process. ("unknown", False) when it cannot tell."""
    for path in _mlx_libraries():
        # Debian's libblas.so.3 may be an alternatives link to OpenBLAS: name what it resolves to.
        path = str(Path(path).resolve())
        name = Path(path).name.lower()
        for needle, label in _BLAS_NAMES:
            if needle in name or (needle == "accelerate" and "accelerate.framework" in path.lower()):
                return f"{label}: {Path(path).name}", label.startswith("reference")
    if sys.platform == "darwin":
        return "Accelerate (macOS MLX builds link it)", False
    return "unknown", False


def _mlx_libraries() -> list[str]:
    core = Path(mx.__file__)
    binaries = [core, *sorted(core.parent.glob("lib/libmlx*"))]
    tool = ["otool", "-L"] if sys.platform == "darwin" else ["ldd"]
    found: list[str] = []
    for binary in binaries:
        try:
            out = subprocess.run([*tool, str(binary)], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        found += [part for line in out.splitlines() for part in line.split() if "/" in part]
    if found or not sys.platform.startswith("linux"):
        return found
    # No ldd: what the process mapped from the folders MLX's wheels install (mlx/, mlx_*.libs/).
    roots = (str(core.parent), str(core.parent.parent / "mlx_"))
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith(roots) and re.search(r"\.so(\.|$)", p))
