"""Every benchmark's declaration, torch-free: importing this package registers the built-in
ones."""
from kvbench.benchmarks.specs import (  # noqa: F401 - registers them
    compaction, decode_attention, ladder, niah, parity, perplexity, proofs, quality, ruler, speed,
    stress,
)
from kvbench.benchmarks.specs.base import BENCHMARKS, Benchmark, MetricSpec, register_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "MetricSpec", "register_benchmark"]
