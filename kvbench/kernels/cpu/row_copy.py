"""One call that writes every row's packed token of a batched step into the row's own arrays
(kvbench.models.batch_lane): each (row, stored array, head) is one run of contiguous bytes, from
the batched encode's array to where the row's room ends. One torch copy per run costs more in
Python and dispatch than the bytes it moves (a few dozen each)."""
from __future__ import annotations

import numpy as np
import torch
from numba import carray, njit

from kvbench.kernels.cpu.row_decode import as_pointer


def run_size(tensor: torch.Tensor) -> int:
    """Bytes of one (batch, head, token) entry of `tensor` (batch, heads, tokens, ...), which
    must lie contiguous."""
    elements = 1
    for axis in range(tensor.dim() - 1, 2, -1):
        if tensor.shape[axis] > 1 and tensor.stride(axis) != elements:
            raise ValueError(f"a token's entry is not contiguous: strides {tensor.stride()}")
        elements *= tensor.shape[axis]
    return elements * tensor.element_size()


def head_starts(tensor: torch.Tensor, first_row: int, rows: int) -> np.ndarray:
    """(rows, heads): the address of token 0 of each head of rows first_row.. of `tensor`."""
    size, strides = tensor.element_size(), tensor.stride()
    row = (first_row + np.arange(rows, dtype=np.int64)) * (strides[0] * size)
    head = np.arange(tensor.shape[1], dtype=np.int64) * (strides[1] * size)
    return tensor.data_ptr() + row[:, None] + head[None, :]


def token_stride(tensor: torch.Tensor) -> int:
    return tensor.stride(2) * tensor.element_size()


@njit(cache=True)
def copy_runs(sources: np.ndarray, targets: np.ndarray, sizes: np.ndarray) -> None:
    """sizes[i] bytes from address sources[i] to address targets[i], for every i."""
    for i in range(sources.shape[0]):
        source = carray(as_pointer(sources[i]), (sizes[i],), np.uint8)
        target = carray(as_pointer(targets[i]), (sizes[i],), np.uint8)
        for b in range(sizes[i]):
            target[b] = source[b]
