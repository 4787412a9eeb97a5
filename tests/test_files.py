"""What kvbench writes is whole and readable as any file the user makes: the mode open() gives
(0666 less the umask), not mkstemp's private 0600, so a web server can publish reports and
figures."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kvbench.files import atomic_write_text, replacing
from kvbench.report.html import build_site
from kvbench.results import load_results
from tests.plugins.suites import SMALL_RESULTS


@pytest.fixture
def umask():
    """Set the umask for the test; the old one is put back after it."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_written_file_takes_the_mode_open_would_give(tmp_path, umask):
    atomic_write_text(tmp_path / "public.md", "x")
    assert _mode(tmp_path / "public.md") == 0o644
    umask(0o027)
    atomic_write_text(tmp_path / "group.md", "x")
    assert _mode(tmp_path / "group.md") == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.md"]


def test_the_page_its_reports_and_figures_are_readable_by_all(tmp_path, umask):
    pytest.importorskip("matplotlib", reason="the figures need the plots extra")
    build_site([("small.json", load_results(SMALL_RESULTS))], tmp_path / "site")
    written = [p for p in (tmp_path / "site").rglob("*") if p.is_file()]
    assert {p.suffix for p in written} >= {".html", ".json", ".md", ".png"}
    assert {p.relative_to(tmp_path).as_posix(): _mode(p) for p in written} == {
        p.relative_to(tmp_path).as_posix(): 0o644 for p in written}
