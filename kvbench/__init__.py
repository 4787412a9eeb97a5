"""kvbench: benchmark and validate KV-cache compression methods.

The Python API: load_suite (a YAML suite, checked and expanded into cases) and run_suite (run
them into a folder). The package map is in ARCHITECTURE.md.
"""
from kvbench.hardware import KVBENCH_VERSION as __version__


def load_suite(path, **overrides):
    """A suite file, or a shipped suite by name (`load_suite("quick")`), checked and expanded."""
    from kvbench.suite.loader import load_suite as load
    from kvbench.suite.locate import locate_suite

    return load(locate_suite(str(path)), **overrides)


def run_suite(suite, out_dir, **options):
    from kvbench.run.runner import run_suite as run

    return run(suite, out_dir, **options)


__all__ = ["__version__", "load_suite", "run_suite"]
