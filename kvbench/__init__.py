"""kvbench: benchmark and validate KV-cache compression methods."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"


def load_suite(path, **overrides):
    from kvbench.suite.loader import load_suite as _load

    return _load(path, **overrides)


def run_suite(suite, out_dir, **options):
    from kvbench.runner import run_suite as _run

    return _run(suite, out_dir, **options)


__all__ = ["__version__", "load_suite", "run_suite"]
