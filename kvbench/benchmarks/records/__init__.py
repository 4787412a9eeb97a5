"""The benchmarks' records (kvbench.benchmarks.records.base): per benchmark, what its
measurement writes into a case's info and what its report reads back."""
