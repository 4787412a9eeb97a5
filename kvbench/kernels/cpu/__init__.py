"""CPU kernels (numba): the fused decode attention over packed K/V (kvbench.kernels.cpu.attention),
and its batched form, every row of a batched step in one call (kvbench.kernels.cpu.batched).

Imported only where they run (CPU tensors, numba installed): `import numba` happens here.
numba's own thread pool ("workqueue"), not its OpenMP layer: a second OpenMP runtime beside
torch's left its threads spinning and slowed every later torch operation ~500x (measured).
The pool is not for concurrent callers: kvbench.kernels.cpu.attention holds a lock.
"""
import numba

numba.config.THREADING_LAYER = "workqueue"


def start() -> None:
    """Compile one trivial function: numba's and LLVM's one-time start, ~100 MB resident, which
    the first case that decodes through a kernel would otherwise count as its own evaluation
    (the first intq decode step on the 8B-shaped checkpoint rose 148 MB over its start; after
    this, 51 MB)."""
    numba.njit("float64(float64)")(_one_more)


def _one_more(x: float) -> float:
    return x + 1.0
