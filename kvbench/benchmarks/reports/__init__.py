"""Each built-in benchmark's part of the report (a kvbench.reportkit.benchmark.BenchmarkReport,
set as its declaration's `report`): the sections after its table in report.md with their
figures, its leaderboard's columns on the results page, and its metrics in the by-method table.
One module per benchmark that has any (retrieval.py: what niah and ruler share). Torch-free;
matplotlib is imported only when a figure is drawn."""
