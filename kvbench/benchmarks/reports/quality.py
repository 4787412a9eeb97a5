"""The quality benchmark's part of the report: its leaderboard's columns and its metrics in the
by-method table (no section beyond its table)."""
from __future__ import annotations

from kvbench.reportkit.benchmark import BenchmarkReport, Board

REPORT = BenchmarkReport(
    board=Board(None, "kl_plain_method", ("top1_agreement", "top_k_overlap", "greedy_agreement")),
    headline=("top_k_overlap", "kl_plain_method", "top1_agreement", "greedy_agreement"),
)
