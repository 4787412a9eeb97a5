"""Torch device choice, synchronisation before timer reads, and peak-memory probes."""
from __future__ import annotations

import resource
import sys
import time

import torch

from kvbench.backends.devices import DEVICES

# Storage dtypes a suite may name.
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    """'auto' picks cuda, then mps, then cpu; an explicit device that is absent is an error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' asked for, but torch sees no Apple GPU")
    if name not in DEVICES and not name.startswith("cuda:"):
        raise ValueError(f"unknown device {name!r}; use one of {', '.join(DEVICES)}")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(fn, device: torch.device):
    """(result, seconds) of fn(), with the device drained before both clock reads."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak device memory on CUDA; peak process RSS on CPU (it never resets)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
