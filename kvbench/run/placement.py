"""How many GPUs a case needs where cases share a machine's or a cluster's GPUs (`--gpus`, Ray):
one for a CUDA case, as many as its model's device_map spreads it over, none for a CPU case."""
from __future__ import annotations

from kvbench.models.options import LoadOptions
from kvbench.suite.case import Case

WHOLE_NODE = -1  # device_map auto, balanced or sequential, unbounded: every GPU it can see


def may_use_gpu(case: Case) -> bool:
    """Whether the case runs on a GPU where there is one: device cuda (cuda:N), or auto."""
    return case.backend == "torch" and (case.device == "auto"
                                        or case.device.startswith("cuda"))


def gpus_needed(case: Case, gpus_present: bool) -> int:
    """GPUs the case asks for: 0 for a CPU case (an auto one where no GPU is present), 1 for
    a case on one GPU, the devices its device_map names, or WHOLE_NODE."""
    if not may_use_gpu(case) or (case.device == "auto" and not gpus_present):
        return 0
    return devices_spanned(case.load_options)


def devices_spanned(options: LoadOptions) -> int:
    """GPUs a model loaded with `options` spans: 1 without a device_map; the GPUs a
    {module: device} map or max_memory names; WHOLE_NODE for auto, balanced or sequential
    with no max_memory (accelerate then fills every GPU the process sees)."""
    if options.device_map is None:
        return 1
    named = gpus_named(options)
    if isinstance(options.device_map, dict):
        return max(1, len(named))
    return len(named) if named else WHOLE_NODE


def gpus_named(options: LoadOptions) -> set[int]:
    """The GPU indices a {module: device} device_map names, or else max_memory's keys."""
    if isinstance(options.device_map, dict):
        devices = options.device_map.values()
    else:
        devices = options.max_memory or {}
    return {_gpu(device) for device in devices} - {None}


def _gpu(device) -> int | None:
    """A device_map's or max_memory's device as a GPU's index; None for cpu and disk."""
    text = str(device).strip()
    if text.startswith("cuda:"):
        text = text[len("cuda:"):]
    elif text == "cuda":
        text = "0"
    return int(text) if text.isdigit() else None
