"""The speed benchmark's part of the report: its leaderboard's columns (no section beyond its
table), and its row: n/a for the metrics of a step the case did not time because it did no work
(its record's not_timed)."""
from __future__ import annotations

from kvbench.benchmarks.records.speed import SpeedRecord
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.tables import Cell
from kvbench.results import CaseResult


class SpeedReport(BenchmarkReport):
    def cell(self, case: CaseResult, metric: str) -> Cell:
        if metric not in case.metrics and metric.partition("_")[0] in (
                SpeedRecord.of(case).not_timed or ()):
            return Cell("n/a")
        return super().cell(case, metric)


REPORT = SpeedReport(board=Board("compression_ratio", None, (
    "encode_vs_memcpy", "decode_vs_memcpy", "encode_gb_s", "decode_gb_s")))
