"""Every benchmark's declaration, torch-free. The built-in ones are named in BENCHMARKS's table
(kvbench.benchmarks.specs.base) and imported when first looked up."""
from kvbench.benchmarks.specs.base import BENCHMARKS, Benchmark, MetricSpec, register_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "MetricSpec", "register_benchmark"]
