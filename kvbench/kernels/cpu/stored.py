"""What every CPU kernel shares to read a packed cache where it lies: float16 scalars looked up
from their bits, numba's array types for eager signatures, views of the stored tensors, and how
a read is split into jobs for numba's threads."""
from __future__ import annotations

import functools

import numba
import numpy as np
import torch
from numba import types
from numba.extending import overload

# Vectorised sums (reassociation) and fused multiply-adds; nothing assumed about inf or NaN.
FAST = {"reassoc", "contract"}
MIN_CHUNK = 256  # tokens per parallel job at least: a job's setup is not free
JOBS_PER_THREAD = 4  # jobs per thread, so uneven ones even out
PARALLEL_ROWS = 8192  # rows (sequence-heads x tokens) read at least for the kernels to go parallel
# Every float16 bit pattern as float32: stored scales, mins and norms are looked up.
HALF_TO_FLOAT = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
NO_TABLE = np.zeros(8, np.float32)  # intq's codes are their values


def as_float(x, half):
    """A stored scalar as float32: float16 (held as its uint16 bits, looked up in `half`) or
    float32."""


@overload(as_float, inline="always")
def _as_float_typed(x, half):
    if isinstance(x, types.Integer):
        return lambda x, half: half[x]
    return lambda x, half: np.float32(x)


def array(dtype: type, ndim: int, layout: str = "C") -> types.Array:
    """numba's type of an array of `dtype` (a numpy scalar type), for eager signatures."""
    return types.Array(numba.from_dtype(np.dtype(dtype)), ndim, layout)


def flat(t: torch.Tensor) -> np.ndarray:
    """(batch, kv_heads, a, ...) as a (batch * kv_heads, a, rest) array, float16 as its uint16
    bits: a view of the packed cache (a leading slice of its tokens included)."""
    t = t.detach().reshape(t.shape[0] * t.shape[1], t.shape[2], -1)
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.float16 else t.numpy()


@functools.cache
def slot_order(dim: int) -> torch.Tensor:
    """The dim held at each position of a slot-major row (made once per head size)."""
    m_count = dim // 8
    return torch.arange(dim).reshape(m_count, 8).T.reshape(-1)


def job_split(units: int, heads: int, least: int) -> tuple[int, int]:
    """(chunks per sequence-head, units per chunk) for reading `units` (tokens, or groups of
    them) of `heads` sequence-heads: enough jobs to fill every thread, at least `least` units
    each."""
    want = max(1, -(-numba.get_num_threads() * JOBS_PER_THREAD // heads))
    per = max(least, -(-units // want))
    return -(-units // per), per


def on_pool(rows: int) -> bool:
    """Whether a read of `rows` (sequence-heads x tokens) runs on numba's threads: for small ones
    waking the pool costs more than the work (and its threads then slow torch's next
    operations)."""
    return rows >= PARALLEL_ROWS and numba.get_num_threads() > 1
