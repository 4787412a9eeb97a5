"""How each built-in benchmark measures, registered against its declaration
(kvbench.benchmarks.specs): importing this package registers them."""
from kvbench.benchmarks.measure import (  # noqa: F401 - registers them
    compaction, dataset, decode_attention, ladder, multiturn, niah, parity, perplexity, proofs,
    quality, ruler, speed, stress,
)
