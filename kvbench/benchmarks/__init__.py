"""Built-in benchmarks register themselves on import."""
from kvbench.benchmarks import (  # noqa: F401
    compaction, decode_attention, ladder, niah, parity, perplexity, proofs, quality, ruler, speed, stress,
)
from kvbench.benchmarks.base import BENCHMARKS, Benchmark, BenchmarkOutput, MetricSpec, RunContext

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkOutput", "MetricSpec", "RunContext"]
