"""The runner: per-case isolation and timeout, fixed seeds, results.jsonl and --resume (with a
real process killed by SIGINT), and archiving an earlier run instead of overwriting it.

The cases come from the test-only benchmarks of tests/plugins (no model); the Step benchmark
appends its index to cases.log in the working folder, so a test can tell which cases really ran.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch

from kvbench import cli
from kvbench.runner import run_suite
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import invoke, wide_consoles  # noqa: F401
from tests.plugins.kvb_testplugin import CRASH_MESSAGE

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "tests" / "suites" / "cli"
STEP = "tests.plugins.kvb_testplugin:Step"
STEP_IDS = [f"{STEP}/Nop/i={i}" for i in range(5)]


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


def jsonl_lines(path: Path) -> list[dict]:
    """Every line must parse: a torn or garbled line fails the test."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def logged(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


# ---------------------------------------------------------------- isolation, timeout, seeds


def test_crashing_case_is_isolated_and_the_next_cases_run(tmp_path):
    suite = load_suite(SUITES / "crash.yaml")
    outcome = run_suite(suite, tmp_path / "out")
    statuses = [(c.id, c.status) for c in outcome.result.cases]
    assert statuses == [("proofs/identity", "ok"),
                        ("tests.plugins.kvb_testplugin:Crash/identity", "error"),
                        (f"{STEP}/identity", "ok")]
    crash = outcome.result.cases[1]
    assert crash.error.type == "ValueError"
    assert crash.error.message == f"{CRASH_MESSAGE} (i=0)"
    assert "in _explode" in crash.error.traceback
    assert crash.error.traceback.rstrip().endswith(f"ValueError: {CRASH_MESSAGE} (i=0)")
    assert crash.metrics == {} and crash.claims == []
    after = outcome.result.cases[2]
    assert after.error is None and after.metrics["value"].value == 7
    assert [c.verdict for c in after.claims] == ["held"]
    # the error is in the jsonl too, with its traceback
    lines = jsonl_lines(tmp_path / "out" / "results.jsonl")
    assert lines[2]["case"]["error"]["traceback"] == crash.error.traceback


def test_case_over_its_timeout_is_stopped_and_the_run_goes_on(tmp_path):
    suite = load_suite(SUITES / "timeout.yaml")
    assert [c.timeout_s for c in suite.cases] == [1, 1, 30]
    clock = time.perf_counter()
    outcome = run_suite(suite, tmp_path / "out")
    elapsed = time.perf_counter() - clock
    quick, slow, last = outcome.result.cases
    assert (quick.status, slow.status, last.status) == ("ok", "timeout", "ok")
    assert slow.id == f"{STEP}/Nop/sleep_s=5.0"
    assert slow.error.type == "CaseTimeout" and "timeout of 1 s" in slow.error.message
    assert slow.metrics == {}
    assert 0.9 <= slow.duration_s < 2.5  # cut at 1 s, not after the 5 s sleep
    assert elapsed < 4.5
    assert last.metrics["value"].value == 2  # the case after the timeout ran, and was not hit
    saved = load_json(tmp_path / "out" / "results.json")
    assert [c["status"] for c in saved["cases"]] == ["ok", "timeout", "ok"]


def _seeded_values(seed: int) -> tuple[float, float, float]:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def _rand_metrics(case) -> tuple[float, float, float]:
    return tuple(case.metrics[name].value for name in ("rand_py", "rand_np", "rand_torch"))


def test_seeds_are_fixed_per_case(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite = load_suite(SUITES / "steps.yaml")
    assert {c.seed for c in suite.cases} == {3}
    full = run_suite(suite, tmp_path / "a").result
    expected = _seeded_values(3)
    # every case starts from the suite's seed, whatever ran before it
    assert [_rand_metrics(c) for c in full.cases] == [expected] * 5
    # the same case run alone, after the RNGs were disturbed, gives identical metrics
    random.random(), np.random.rand(), torch.rand(3)
    alone = run_suite(suite, tmp_path / "b", cases=[suite.cases[3]]).result
    assert len(alone.cases) == 1 and alone.cases[0].id == STEP_IDS[3]
    assert alone.cases[0].metrics == full.cases[3].metrics
    assert _seeded_values(4) != expected  # the check above can tell seeds apart


# ---------------------------------------------------------------- resume after a real kill


def _default_sigint():
    # A child inherits an ignored SIGINT (e.g. from a background CI job); Python then never
    # raises KeyboardInterrupt. Restore the default so the child behaves as on a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kvbench(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "300"
    return subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", *args], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_default_sigint, **kwargs,
    )


def _case_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.startswith('{"type":"case"'))


def test_resume_after_sigint_runs_only_the_unfinished_cases(tmp_path):
    suite, out = SUITES / "steps_slow.yaml", tmp_path / "out"
    log, jsonl = tmp_path / "cases.log", out / "results.jsonl"
    proc = _kvbench(["run", str(suite), "--out", str(out)], tmp_path)
    try:
        deadline = time.monotonic() + 60
        while _case_lines(jsonl) < 2:
            assert proc.poll() is None, f"exited early ({proc.returncode}):\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "no two finished cases within 60 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert "interrupted" in output and f"--out {out} --resume" in output

    lines = jsonl_lines(jsonl)  # parses: nothing torn
    assert lines[0]["type"] == "header"
    finished = [line["case"] for line in lines[1:]]
    assert 2 <= len(finished) < 5, "the run was not interrupted mid-way"
    finished_i = [c["bench_params"]["i"] for c in finished]
    assert finished_i == list(range(len(finished)))
    interrupted = load_json(out / "results.json")
    assert interrupted["interrupted"] is True
    assert [c["id"] for c in interrupted["cases"]] == [c["id"] for c in finished]
    before = logged(log)
    assert before[: len(finished)] == finished_i

    resumed = _kvbench(["run", str(suite), "--out", str(out), "--resume"], tmp_path)
    output, _ = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, output
    assert f"resuming: {len(finished)} finished case(s) kept" in output
    ran_again = logged(log)[len(before):]
    assert not set(ran_again) & set(finished_i), f"finished cases ran again: {ran_again}"
    assert sorted(finished_i + ran_again) == list(range(5))  # each case once, none lost

    final = load_json(out / "results.json")
    assert final["interrupted"] is False
    assert [c["id"] for c in final["cases"]] == STEP_IDS
    assert all(c["status"] == "ok" for c in final["cases"])
    assert [c["metrics"]["value"]["value"] for c in final["cases"]] == [0, 1, 2, 3, 4]
    # the finished cases were kept as they were, not re-measured
    assert final["cases"][: len(finished)] == finished
    lines = jsonl_lines(jsonl)
    assert [line["type"] for line in lines] == ["header"] + ["case"] * 5
    assert sorted(line["case"]["id"] for line in lines[1:]) == STEP_IDS
    assert not list(out.glob("previous"))  # --resume archives nothing


def _full_run(tmp_path, monkeypatch, suite=SUITES / "steps.yaml") -> Path:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = invoke("run", suite, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_resume_drops_a_torn_last_line(tmp_path, monkeypatch):
    out = _full_run(tmp_path, monkeypatch)
    jsonl = out / "results.jsonl"
    lines = jsonl.read_text().splitlines(keepends=True)
    assert len(lines) == 6
    third = lines[3]
    jsonl.write_text("".join(lines[:3]) + third[: len(third) // 2])  # killed mid-write
    (tmp_path / "cases.log").unlink()
    result = invoke("run", SUITES / "steps.yaml", "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    assert "resuming: 2 finished case(s) kept" in result.output
    assert logged(tmp_path / "cases.log") == [2, 3, 4]
    parsed = jsonl_lines(jsonl)  # the half line is gone, not glued to the next one
    assert [line["type"] for line in parsed] == ["header"] + ["case"] * 5
    assert [line["case"]["id"] for line in parsed[1:]] == STEP_IDS
    assert [c["id"] for c in load_json(out / "results.json")["cases"]] == STEP_IDS


def test_resume_with_a_changed_suite_is_refused(tmp_path, monkeypatch):
    suite = tmp_path / "steps.yaml"
    shutil.copy(SUITES / "steps.yaml", suite)
    out = _full_run(tmp_path, monkeypatch, suite)
    saved = {name: (out / name).read_bytes() for name in ("results.json", "results.jsonl")}
    suite.write_text(suite.read_text().replace("seed: 3", "seed: 4"))
    (tmp_path / "cases.log").unlink()
    result = invoke("run", suite, "--out", out, "--resume")
    assert result.exit_code == 2
    assert "different version of suite 'cli-steps'" in result.output
    assert "run without --resume or with another --out" in result.output
    assert not (tmp_path / "cases.log").exists()  # nothing ran
    assert {name: (out / name).read_bytes() for name in saved} == saved
    assert not (out / "previous").exists()


def test_resume_without_an_earlier_run_runs_everything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", SUITES / "steps.yaml", "--out", tmp_path / "out", "--resume")
    assert result.exit_code == 0, result.output
    assert logged(tmp_path / "cases.log") == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- archiving an earlier run


def test_new_run_moves_the_earlier_one_to_previous(tmp_path, monkeypatch):
    out = _full_run(tmp_path, monkeypatch)
    first = {name: (out / name).read_bytes() for name in ("results.json", "results.jsonl",
                                                          "report.md")}
    result = invoke("run", SUITES / "steps.yaml", "--out", out, "--limit", "2")
    assert result.exit_code == 0, result.output
    stamps = list((out / "previous").iterdir())
    assert len(stamps) == 1 and re.fullmatch(r"\d{8}-\d{6}", stamps[0].name)
    assert {p.name: p.read_bytes() for p in stamps[0].iterdir()} == first
    # the new run is a fresh one: its own header and only its own cases
    lines = jsonl_lines(out / "results.jsonl")
    assert [line["type"] for line in lines] == ["header", "case", "case"]
    assert len(load_json(out / "results.json")["cases"]) == 2


class _FrozenClock(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2030, 1, 2, 3, 4, 5, tzinfo=tz)


def test_archives_made_in_the_same_second_are_all_kept(tmp_path, monkeypatch):
    import kvbench.runner

    monkeypatch.setattr(kvbench.runner, "datetime", _FrozenClock)
    out = _full_run(tmp_path, monkeypatch)  # 5 cases
    for limit in ("1", "2"):
        assert invoke("run", SUITES / "steps.yaml", "--out", out, "--limit", limit).exit_code == 0
    archived = sorted(len(load_json(p)["cases"]) for p in out.glob("previous/*/results.json"))
    assert archived == [1, 5]  # both earlier runs kept (the current one has 2)
