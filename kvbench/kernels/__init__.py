"""Fused kernels behind the method contracts: Triton for CUDA (kvbench.kernels.triton) and a
fused decode attention for the CPU (kvbench.kernels.cpu, numba).

A codec's `impl` picks the path that encodes, decodes and attends over its packed layout:
"torch" the reference, "triton" the kernels (byte-identical layouts, checked against the
reference), "auto" the kernels on CUDA tensors where triton is installed and the layout has
them, else the reference; on CPU tensors "auto" attends with the CPU kernel where numba is
installed and the layout has it. This module imports neither torch, triton, numba nor the
kernels: a machine without them installs, imports and runs everything but the kernels.

The kernels also run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, set before
triton is first imported): that is how they are tested without a GPU.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IMPLS = ("auto", "torch", "triton")
INSTALL_HINT = "pip install 'kvbench[cuda]'"


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def interpreting() -> bool:
    """Whether Triton kernels run in its interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_impl(impl: str, unsupported: str | None) -> None:
    """ValueError for an impl that cannot run anywhere: an unknown name, or "triton" for a
    layout with no kernels (`unsupported` says why) or where triton is not installed. For a
    method's __post_init__, so a suite asking for it is refused before anything runs."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl != "triton":
        return
    if unsupported:
        raise ValueError(f"impl 'triton': no kernel for this layout ({unsupported}); use impl"
                         " 'auto' or 'torch'")
    if not triton_installed():
        raise ValueError(f"impl 'triton' needs triton, which is not installed: {INSTALL_HINT}")


def use_triton(impl: str, device: torch.device, unsupported: str | None) -> bool:
    """Whether the kernels run for tensors on `device`: "auto" on CUDA when they can, "triton"
    always (RuntimeError where it cannot: CPU tensors outside the interpreter)."""
    if impl == "torch" or (impl == "auto" and (device.type != "cuda" or unsupported
                                               or not triton_installed())):
        return False
    check_impl(impl, unsupported)
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(f"impl 'triton' runs on CUDA tensors (or on the CPU under "
                           f"TRITON_INTERPRET=1); these are on {device.type}")
    return True


class ImplLog:
    """Which implementation ran each operation of a method's codecs ("encode", "decode",
    "attention"), for the results: a method hands one to every codec it builds."""

    def __init__(self):
        self.ran: dict[str, set[str]] = {}

    def note(self, operation: str, impl: str) -> None:
        self.ran.setdefault(operation, set()).add(impl)

    def summary(self) -> dict[str, str]:
        """{operation: impl, or several joined by ' + '}, for results.json."""
        return {op: " + ".join(sorted(impls)) for op, impls in sorted(self.ran.items())}
