"""The primitives reports draw with, and that a benchmark's own report imports: Markdown tables
and number formats (tables), what figures share (figures: family styles, the Pareto front,
PNGs, `figure_text`), the results page's inline SVG charts in those styles (svg), the memory
footprint's table (footprint), and the base of what a benchmark declares (benchmark: Board,
BenchmarkReport). It sits below the benchmarks: nothing here names or imports one."""
from kvbench.reportkit.benchmark import BenchmarkReport, Board
from kvbench.reportkit.figures import (
    MATPLOTLIB_MISSING, PlotPath, PlotUnavailable, figure_text, method_family, pyplot, save_png,
)
from kvbench.reportkit.tables import fmt_number, md_table, ok_cases

__all__ = ["BenchmarkReport", "Board", "MATPLOTLIB_MISSING", "PlotPath", "PlotUnavailable",
           "figure_text", "fmt_number", "md_table", "method_family", "ok_cases", "pyplot",
           "save_png"]
