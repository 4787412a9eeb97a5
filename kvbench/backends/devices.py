"""The device names and storage dtypes a suite or the command line may give (torch-free: the
suite schema and the benchmarks' declarations use them)."""

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # the storage dtypes a suite may name
