"""Float operations whose rounding every implementation of a layout shares: torch on the CPU,
torch on CUDA and the Triton kernels (kvbench.kernels.triton) write the same bits only if each of
these rounds the same way everywhere.

- Sums: torch's reductions and a GPU kernel's each sum in their own order. Here the order is
  fixed: zero-pad to a power of two, then add adjacent pairs, level by level (x0+x1, x2+x3,
  ...), until one value is left (kvbench.kernels.triton.common.pairwise_sum does the same).
- Square roots: torch's float32 sqrt on the CPU is not correctly rounded; pairwise_norm's is.
- Division by a number: torch on CUDA multiplies by the number's reciprocal, which rounds
  differently from the division that torch on the CPU does; divide() divides on both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of x, adjacent pairs first (see the module docstring)."""
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = F.pad(x, (0, width - n))  # adding zeros changes no partial sum
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def divide(x: torch.Tensor, number: float) -> torch.Tensor:
    """x / number, correctly rounded in x's dtype on every device (the number as a tensor of
    x's dtype on x's device: torch on CUDA would multiply by 1 / number instead)."""
    return x / torch.tensor(number, dtype=x.dtype, device=x.device)


def pairwise_norm(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """sqrt(pairwise_sum(x * x)): the Euclidean norm over the last dim, in x's dtype, its square
    root correctly rounded. torch's float32 sqrt on the CPU is not (it differed from IEEE in the
    last bit for 45 of 200 sums, measured); taken in float64 and rounded once to float32 it is,
    as the kernels' sqrt_rn."""
    squares = pairwise_sum(x * x)
    norm = squares.double().sqrt().to(squares.dtype)
    return norm.unsqueeze(-1) if keepdim else norm
