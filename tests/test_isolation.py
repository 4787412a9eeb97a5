"""`kvbench run --isolate`: each case in a fresh process; a crash or a hang there costs that
case only."""
from __future__ import annotations

import json
import os

import pytest

from kvbench.run import isolated as isolation
from kvbench.run.runner import run_suite
from kvbench.suite.loader import load_suite
from tests.test_runner import _Statuses

SUITE = """\
kvbench: 1
defaults: {{timeout_s: {timeout}}}
methods:
  - name: tests.plugins.kvb_testplugin:Nop
benchmarks:
  - kind: tests.plugins.kvb_testplugin:{first}
    params: {{sleep_s: {sleep}}}
  - kind: tests.plugins.kvb_testplugin:Keeps
    params: {{i: 7}}
"""


def _run(tmp_path, first: str, timeout: float = 600, isolate: bool = True, sleep: float = 0):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "s.yaml").write_text(SUITE.format(first=first, timeout=timeout, sleep=sleep))
    progress = _Statuses()
    result = run_suite(load_suite(tmp_path / "s.yaml"), tmp_path / "out", progress=progress,
                       isolate=isolate).result
    return {c.benchmark.rpartition(":")[2]: c for c in result.cases}, progress


def test_a_segfault_costs_its_case_only(tmp_path):
    cases, progress = _run(tmp_path, "Segfault")
    crashed = cases["Segfault"]
    assert crashed.status == "error"
    assert crashed.error.type == "ProcessDied"
    assert "killed by SIGSEGV" in crashed.error.message
    after = cases["Keeps"]
    assert after.status == "ok" and after.metrics["value"].value == 7
    # its progress and its record came back through the pipe, from another process
    assert "sample of case 7" in progress.lines
    [kept] = [json.loads(line) for line in (tmp_path / "out/predictions.jsonl").open()]
    assert kept["case"] == after.id and kept["i"] == 7 and kept["pid"] != os.getpid()


@pytest.mark.slow
def test_a_hang_the_alarm_cannot_stop_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "GRACE_S", 1.0)
    cases, _ = _run(tmp_path, "Hang", timeout=1, sleep=60)
    hung = cases["Hang"]
    assert hung.status == "timeout"
    assert "did not stop; its process was killed" in hung.error.message
    assert hung.duration_s < 20
    assert cases["Keeps"].status == "ok"


def test_isolated_results_equal_in_process_ones(tmp_path):
    """The same seeds in a fresh process give the same metrics."""
    isolated, _ = _run(tmp_path / "a", "Step", isolate=True)
    inline, _ = _run(tmp_path / "b", "Crash", isolate=False)
    for name in ("value", "rand_py", "rand_np", "rand_torch"):
        assert isolated["Keeps"].metrics[name] == inline["Keeps"].metrics[name]
    assert inline["Crash"].status == "error"
