"""The decode_attention benchmark's part of the report: its leaderboard's columns (no section
beyond its table)."""
from __future__ import annotations

from kvbench.reportkit.benchmark import BenchmarkReport, Board

REPORT = BenchmarkReport(board=Board("compression_ratio", "rel_error", ()))
