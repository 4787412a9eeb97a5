"""Benchmarks: each a torch-free declaration (kvbench.benchmarks.specs: parameters, metrics,
checks, report) and its measurement (kvbench.benchmarks.measure), registered against the
declaration. A plug-in benchmark may be one class that declares and measures (has run()); the
built-ins are split so that validating a suite needs no torch.

measurement(benchmark class) is what runs a case, importing first the module the declaration
names (`measured_in`); importing this package imports no benchmark (no torch).
"""
from __future__ import annotations

import importlib

from kvbench.benchmarks.specs import BENCHMARKS, Benchmark, MetricSpec
from kvbench.benchmarks.specs.base import registered_measurement


def measurement(benchmark_cls: type[Benchmark]) -> Benchmark:
    """What measures `benchmark_cls`: an instance of the class registered for it exactly, or of
    the class itself when it has run(params, method, ctx)."""
    if benchmark_cls.measured_in:
        importlib.import_module(benchmark_cls.measured_in)
    found = registered_measurement(benchmark_cls)
    if found is None and callable(getattr(benchmark_cls, "run", None)):
        found = benchmark_cls
    if found is None:
        name = benchmark_cls.name or benchmark_cls.__name__
        raise NotImplementedError(f"benchmark {name!r} has nothing that measures it (give it"
                                  " run(), or register a class with"
                                  " kvbench.benchmarks.specs.base.measures)")
    return found()


__all__ = ["BENCHMARKS", "Benchmark", "MetricSpec", "measurement"]
