"""The speed benchmark's part of the report: its leaderboard's columns (no section beyond its
table)."""
from __future__ import annotations

from kvbench.reportkit.benchmark import BenchmarkReport, Board

REPORT = BenchmarkReport(board=Board("compression_ratio", None, (
    "encode_vs_memcpy", "decode_vs_memcpy", "encode_gb_s", "decode_gb_s")))
