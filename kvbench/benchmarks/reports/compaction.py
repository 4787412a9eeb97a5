"""The compaction benchmark's part of the report: its metrics in the by-method table (no
leaderboard columns of its own, no section beyond its table)."""
from __future__ import annotations

from kvbench.reportkit.benchmark import BenchmarkReport

REPORT = BenchmarkReport(headline=("retention", "answer_holds_fact"))
