"""Every benchmark's declaration, torch-free: importing this package registers the built-in
ones."""
# The order of these imports is the order they are registered in, and so the order of the
# leaderboards on the results page (kvbench.report.html): keep it so.
from kvbench.benchmarks.specs import (  # noqa: F401 - registers them, in this order
    proofs, perplexity, quality, niah, ruler, multiturn, dataset, ladder, stress, speed, decode_attention,
    compaction, parity,
)
from kvbench.benchmarks.specs.base import BENCHMARKS, Benchmark, MetricSpec, register_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "MetricSpec", "register_benchmark"]
