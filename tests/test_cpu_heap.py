"""`cpu_heap`: on a CPU, whether glibc keeps freed blocks for reuse (its default) or gives them
back at once, so that a case's resident peak counts what it holds."""
from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from kvbench.backends import process_memory
from kvbench.run.runner import run_suite
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite

glibc_only = pytest.mark.skipif(
    not process_memory.resettable() or platform.libc_ver()[0] != "glibc",
    reason="cpu_heap acts on glibc's allocator (Linux)")

# Freed blocks below the dynamic mmap threshold stay in the heap while a block above them is
# held: 40 blocks of 8 MiB, the newest kept, after a 16 MiB block freed raised the threshold.
RETAINED = textwrap.dedent("""\
    import sys, torch
    from kvbench.backends import process_memory
    process_memory.set_heap(sys.argv[1])
    MB = 1 << 20
    raised = torch.ones(16 * MB // 4)
    del raised
    start = process_memory.reset_high_water()
    blocks = [torch.ones(8 * MB // 4) for _ in range(40)]
    del blocks[:-1]
    status = open("/proc/self/status").read().split("VmRSS:")[1]
    print((int(status.split()[0]) * 1024 - start) // MB)
""")


def _held_after_frees(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", RETAINED, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip())


@glibc_only
def test_released_blocks_go_back_at_once_where_kept_ones_stay_resident():
    """320 MB written and freed but for the newest 8 MB block: kept, the heap stays resident
    below that block; released, only the block is."""
    kept, released = _held_after_frees("keep"), _held_after_frees("release")
    assert kept > 200, kept
    assert released < 30, released


# Blocks below the mmap threshold freed between blocks still held: holes inside the heap, which
# no threshold gives back; trim_heap() (at each forward's end of a case) frees their pages.
HOLES = textwrap.dedent("""\
    import sys, torch
    from kvbench.backends import process_memory
    process_memory.set_heap(sys.argv[1])
    MB = 1 << 20
    def resident():
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
    blocks = [torch.ones(256 * 1024 // 4) for _ in range(800)]
    del blocks[::2]
    before = resident()
    process_memory.trim_heap()
    print((before - resident()) // MB)
""")


@glibc_only
def test_released_heap_gives_back_its_holes_at_a_trim_where_kept_keeps_them():
    """100 MB of 256 KB holes between 100 MB held: a trim frees them released, not kept."""
    freed = {mode: int(subprocess.run([sys.executable, "-c", HOLES, mode], capture_output=True,
                                      text=True, check=True).stdout.strip())
             for mode in ("keep", "release")}
    assert freed["release"] > 80, freed
    assert freed["keep"] < 5, freed


@glibc_only
def test_the_probe_says_freed_blocks_are_released():
    try:
        assert process_memory.set_heap("release")
        assert "released at once" in process_memory.high_water_label()
        assert process_memory.set_heap("keep")
        assert "released" not in process_memory.high_water_label()
    finally:
        process_memory.set_heap("keep")


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="cpu_heap must be one of keep, release"):
        process_memory.set_heap("free")


SUITE = """\
kvbench: 1
name: heap
defaults: {{model: "tiny:llama", device: cpu, repeats: 1{extra}}}
methods:
  - name: identity
benchmarks:
  - kind: perplexity
    params: {{context: 32, continuation: 8}}
"""


def test_a_suite_that_names_no_heap_hashes_as_before(tmp_path):
    """Runs stored before cpu_heap resume: keep, the default, is not in the suite's record."""
    hashes = {}
    for extra in ("", ", cpu_heap: keep", ", cpu_heap: release"):
        (tmp_path / "suite.yaml").write_text(SUITE.format(extra=extra))
        suite = load_suite(tmp_path / "suite.yaml")
        hashes[extra] = suite.hash
        assert [case.cpu_heap for case in suite.cases] == [extra.split(": ")[-1] or "keep"]
        assert ("cpu_heap" in suite.resolved["defaults"]) == ("release" in extra)
    assert hashes[""] == hashes[", cpu_heap: keep"] != hashes[", cpu_heap: release"]


def test_a_bad_heap_is_an_error_naming_the_key(tmp_path):
    (tmp_path / "suite.yaml").write_text(SUITE.format(extra=", cpu_heap: free"))
    with pytest.raises(SuiteError, match="cpu_heap"):
        load_suite(tmp_path / "suite.yaml")


@glibc_only
def test_a_released_case_records_its_probe(tmp_path):
    (tmp_path / "suite.yaml").write_text(SUITE.format(extra=", cpu_heap: release"))
    try:
        result = run_suite(load_suite(tmp_path / "suite.yaml"), tmp_path / "out").result
    finally:
        process_memory.set_heap("keep")
    [case] = result.cases
    assert case.status == "ok", case.error
    assert "released at once" in case.footprint.probe


def test_a_case_trims_the_heap_as_each_of_its_forwards_ends(tmp_path, monkeypatch):
    from kvbench.models import footprint

    trims = []
    monkeypatch.setattr(footprint, "trim_heap", lambda: trims.append(1))
    (tmp_path / "suite.yaml").write_text(SUITE.format(extra=""))
    [case] = run_suite(load_suite(tmp_path / "suite.yaml"), tmp_path / "out").result.cases
    assert case.status == "ok", case.error
    assert len(trims) >= 8  # the 8 tokens of the continuation are forwards of their own
