"""The perplexity benchmark's part of the report: its leaderboard's columns and its metrics in
the by-method table (no section beyond its table)."""
from __future__ import annotations

from kvbench.report.kit.benchmark import BenchmarkReport, Board

REPORT = BenchmarkReport(
    board=Board("compression_ratio", "ppl_rel_delta", ("perplexity", "kv_bytes", "retained_kv")),
    headline=("ppl_rel_delta", "retained_kv"),
)
