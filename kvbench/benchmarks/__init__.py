"""Built-in benchmarks register themselves on import."""
from kvbench.benchmarks import compaction, parity, perplexity, proofs, quality, speed  # noqa: F401
from kvbench.benchmarks.base import BENCHMARKS, Benchmark, BenchmarkOutput, MetricSpec, RunContext

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkOutput", "MetricSpec", "RunContext"]
