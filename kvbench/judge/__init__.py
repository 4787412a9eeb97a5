"""Judging measurements: claims and their verdicts, the baseline gate and its tolerances,
significance tests and intervals. Reads result records only (no torch)."""
