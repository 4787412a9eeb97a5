"""Where the repository's suites are, and what tests need to point into them (plain functions)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every suite kvbench ships: suites/*.yaml, then suites/seeds/*.yaml
SHIPPED_SUITES = sorted(ROOT.glob("suites/*.yaml")) + sorted(ROOT.glob("suites/seeds/*.yaml"))
DATA = ROOT / "tests" / "data"
SMALL_RESULTS = DATA / "results_small.json"  # a real run of tests/data/small.yaml (README there)


def line_of(path: Path, text: str, nth: int = 1) -> int:
    """1-based line number of the nth line of `path` that contains `text`."""
    hits = [i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line]
    if len(hits) < nth:
        raise AssertionError(f"{text!r} is on {len(hits)} line(s) of {path}, not {nth}")
    return hits[nth - 1]
