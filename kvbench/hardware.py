"""The machine fingerprint stored with every result (its `key` decides which baselines apply),
and what ran: kvbench's version and git sha, the libraries' versions, plug-ins' provenance."""
from __future__ import annotations

import hashlib
import inspect
import os
import platform
import subprocess
import sys
from importlib.metadata import (
    PackageNotFoundError, distribution, packages_distributions, version,
)
from pathlib import Path

try:
    KVBENCH_VERSION = version("kvbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    KVBENCH_VERSION = "0.0.0+local"

LIBRARIES = ("torch", "transformers", "numpy", "mlx", "mlx-lm", "triton", "pydantic")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * page_size / 2**30, 1)


def _library_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def code_provenance(cls: type) -> dict[str, str]:
    """Where the code of a class from outside kvbench came from: its module, the distribution
    that installed it and its version (where one did), and the sha256 of its module's source,
    so that a changed plug-in shows in the results even under the same version."""
    found = {"module": cls.__module__}
    try:
        source = Path(inspect.getfile(sys.modules[cls.__module__])).resolve()
        found["sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    except (KeyError, TypeError, OSError):  # built in, or made at run time (no source file)
        return found
    # the distribution whose files hold the source (a top-level name may be shared: "tests")
    for name in packages_distributions().get(cls.__module__.partition(".")[0], []):
        installed = distribution(name)
        if any(Path(installed.locate_file(f)).resolve() == source
               for f in installed.files or () if f.name == source.name):
            found.update(distribution=name, version=installed.version)
            break
    return found


def kvbench_git_sha() -> str | None:
    """The commit of the kvbench source that runs, '+dirty' if changed; None when kvbench is
    installed from a package (its version says what ran)."""
    return git_sha(Path(__file__).parent)


def git_sha(path: str | Path | None = None) -> str | None:
    """HEAD of the repository around `path` (default: the current folder), '+dirty' if changed."""
    cwd = str(path or Path.cwd())
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5,
        )
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def accelerator(device: str = "cpu") -> str:
    """'cpu', or the accelerator's name for cuda/mps."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return "apple-mps" if device == "mps" else "cpu"


def mlx_device() -> str:
    """MLX's default device type: 'cpu' or 'gpu'."""
    import mlx.core as mx

    return "gpu" if mx.default_device() == mx.gpu else "cpu"


def machine_key(device: str = "cpu", backend: str = "torch") -> str:
    """Coarse on purpose: baselines hold across machines of one kind, not one host."""
    name = accelerator(device).lower().replace(" ", "-")
    if backend == "mlx":
        name = f"mlx-{mlx_device()}"
    return f"{platform.system().lower()}-{platform.machine().lower()}-{name}"


def fingerprint(device: str = "cpu", backend: str = "torch") -> dict:
    return {
        "key": machine_key(device, backend),
        "backend": backend,
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "device": f"mlx-{mlx_device()}" if backend == "mlx" else accelerator(device),
        "python": platform.python_version(),
        **{lib: _library_version(lib) for lib in LIBRARIES if _library_version(lib)},
        **(_mlx_fields() if backend == "mlx" else _device_memory(device)),
    }


def _device_memory(device: str) -> dict:
    """{"device_memory_gib": the accelerator's total memory}; {} on the CPU (memory_gib)."""
    if device == "cpu":
        return {}
    import torch

    from kvbench.backends.torch_backend import device_memory_bytes

    total = device_memory_bytes(torch.device(device))
    return {} if total is None else {"device_memory_gib": round(total / 2**30, 1)}


def _mlx_fields() -> dict:
    from kvbench.backends.mlx_backend import blas_info

    return {"mlx_blas": blas_info()[0]}
