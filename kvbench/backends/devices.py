"""The device names and storage dtypes a suite or the command line may give (torch-free: the
suite schema and the benchmarks' declarations use them). Whether a named device exists is asked
of torch where the device is resolved (kvbench.backends.torch_backend.resolve_device)."""
from __future__ import annotations

import re

DEVICES = ("auto", "cpu", "cuda", "mps")  # the kinds; one CUDA device is also named cuda:N
DEVICE_PATTERN = r"^(auto|cpu|cuda|mps|cuda:[0-9]+)$"
DEVICE_FORMS = "auto, cpu, cuda, cuda:N (the N-th CUDA device, from 0) or mps"
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # the storage dtypes a suite may name


def check_device_name(name: str) -> str:
    """`name` when it has one of the forms DEVICE_FORMS lists, else ValueError naming them."""
    if not isinstance(name, str) or not re.fullmatch(DEVICE_PATTERN, name):
        raise ValueError(f"device {name!r} is not one of {DEVICE_FORMS}")
    return name


def cuda_index(name: str) -> int | None:
    """N of a device named cuda:N; None for any other name."""
    kind, _, index = name.partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else None
