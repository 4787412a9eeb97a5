"""CPU kernels (numba): the fused decode attention over packed K/V (kvbench.kernels.cpu.attention),
and its batched form, every row of a batched step in one call (kvbench.kernels.cpu.batched).

Imported only where they run (CPU tensors, numba installed): `import numba` happens here.
numba's own thread pool ("workqueue"), not its OpenMP layer: a second OpenMP runtime beside
torch's left its threads spinning and slowed every later torch operation ~500x (measured).
The pool is not for concurrent callers: kvbench.kernels.cpu.attention holds a lock.
"""
import numba

numba.config.THREADING_LAYER = "workqueue"
