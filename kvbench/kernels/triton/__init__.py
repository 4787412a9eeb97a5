"""Triton kernels for the codecs' packed layouts and a fused decode attention over them.

Imported only where they run (CUDA tensors, or the interpreter): `import triton` happens here.
encode/decode dispatch on the layout's format (kvbench.kernels.formats).
"""
from __future__ import annotations

import torch

from kvbench.kernels.formats import CodebookFormat, IntQFormat, KernelFormat
from kvbench.kernels.triton import codebook, intq


def encode(x: torch.Tensor, fmt: KernelFormat) -> dict[str, torch.Tensor]:
    """The stored tensors of x (..., tokens, D), byte for byte those of the torch codec."""
    return _module(fmt).encode(x, fmt)


def decode(tensors: dict[str, torch.Tensor], fmt: KernelFormat, shape: tuple[int, ...],
           dtype: torch.dtype) -> torch.Tensor:
    """The decoded tensor of `shape` and `dtype`, as the torch codec decodes it."""
    return _module(fmt).decode(tensors, fmt, shape, dtype)


def _module(fmt: KernelFormat):
    if isinstance(fmt, IntQFormat):
        return intq
    if isinstance(fmt, CodebookFormat):
        return codebook
    raise TypeError(f"no kernel for the layout {fmt!r}")
