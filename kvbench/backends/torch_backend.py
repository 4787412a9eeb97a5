"""Torch device choice, synchronisation before timer reads, and peak-memory probes."""
from __future__ import annotations

import gc
import os
import time

import torch

from kvbench.backends import process_memory
from kvbench.backends.devices import check_device_name, cuda_index

# Storage dtypes a suite may name.
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    """'auto' picks cuda, then mps, then cpu; a named device that torch does not see here is
    a ValueError that says what it sees."""
    check_device_name(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device"
                             f"{_cuda_note()}; visible here: {', '.join(visible_devices())}")
        index = cuda_index(name)
        if index is not None and index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} does not exist: torch sees"
                             f" {torch.cuda.device_count()} CUDA device(s){_cuda_note()};"
                             f" visible here: {', '.join(visible_devices())}")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' asked for, but torch sees no Apple GPU; visible here:"
                         f" {', '.join(visible_devices())}")
    return torch.device(name)


def visible_devices() -> list[str]:
    """The devices torch sees here, by the names a suite gives them: cpu, mps, and each CUDA
    device as cuda:N (its name)."""
    found = ["cpu"]
    if torch.backends.mps.is_available():
        found.append("mps")
    if torch.cuda.is_available():
        found += [f"cuda:{i} ({torch.cuda.get_device_properties(i).name})"
                  for i in range(torch.cuda.device_count())]
    return found


def _cuda_note() -> str:
    """Why CUDA devices may be missing: CUDA_VISIBLE_DEVICES hides some, or torch was built
    without CUDA."""
    if torch.version.cuda is None:
        return " (this torch is built without CUDA)"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if hidden is None else f" (CUDA_VISIBLE_DEVICES={hidden!r})"


def device_memory_bytes(device: torch.device) -> int | None:
    """The total memory of an accelerator (CUDA: the device's; MPS: the working set Metal
    recommends); None for the CPU (the machine's memory is the fingerprint's memory_gib)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps":
        return torch.mps.recommended_max_memory()
    return None


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


def reset_peak_memory(device: torch.device) -> int:
    """Reset the peak; return the bytes held now (CUDA: allocated; CPU: process resident)."""
    # An earlier case's cache that only a reference cycle holds would count as loaded, and in
    # the peak: on an H200 a 128k identity cache (5.6 GiB) was still allocated when the next
    # case started.
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return process_memory.reset_high_water()


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(peak bytes since reset_peak_memory, what was measured)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    return process_memory.high_water(), process_memory.high_water_label()


def free_memory(device: torch.device) -> int:
    """Bytes the device can still allocate: CUDA's free memory (mem_get_info), MPS's
    recommended working set less what the driver holds, else the machine's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "mps":
        return max(0, torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    return process_memory.available_bytes()
