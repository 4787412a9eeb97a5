"""The runner: per-case isolation and timeout, fixed seeds, --resume, and archiving an earlier
run instead of overwriting it (kills, torn files, locks and full disks: test_faults.py).

The cases come from the test-only benchmarks of tests/plugins (no model); the Step benchmark
appends its index to cases.log in the working folder, so a test can tell which cases really ran.
"""
from __future__ import annotations

import random
import re
import shutil
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch

from kvbench.results import load_results
from kvbench.run.runner import run_suite
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import (  # noqa: F401
    invoke, jsonl_lines, load_json, logged, wide_consoles,
)
from tests.plugins.kvb_testplugin import CRASH_MESSAGE
from tests.plugins.suites import ROOT

SUITES = ROOT / "tests" / "suites" / "cli"
STEP = "tests.plugins.kvb_testplugin:Step"
STEP_IDS = [f"{STEP}/Nop/i={i}" for i in range(5)]


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
    outcome = run_suite(suite, tmp_path / "out")
    quick, slow, last = outcome.result.cases
    assert (quick.status, slow.status, last.status) == ("ok", "timeout", "ok")
    assert slow.id == f"{STEP}/Nop/sleep_s=60.0"
    assert slow.error.type == "CaseTimeout" and "timeout of 1 s" in slow.error.message
    # stopped inside its run: no metrics, and not before its 1 s timeout, nor after the minute
    # of sleep it asked for (nothing here depends on how fast the machine is)
    assert slow.metrics == {}
    assert 0.9 <= slow.duration_s < slow.bench_params["sleep_s"]
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


class _Statuses:
    """A progress display that keeps the status lines of the run."""

    def __init__(self):
        self.lines = []

    def start(self, total, skipped): ...
    def notice(self, text): ...
    def case_started(self, case): ...
    def case_finished(self, result): ...
    def stop(self): ...

    def status(self, text):
        self.lines.append(text)


MEMO_SUITE = """\
kvbench: 1
name: memo-runs
defaults: {model: "tiny:llama", device: cpu, repeats: 1}
methods:
  - name: identity
  - name: intq
    params: {bits: 4}
benchmarks:
  - kind: quality
    params: {context: 24, continuation: 4, greedy_tokens: 3}
"""


def test_each_run_has_its_own_memo(tmp_path):
    """The cases of one run share the plain reference (made once); another run makes its own."""
    (tmp_path / "memo.yaml").write_text(MEMO_SUITE)
    suite = load_suite(tmp_path / "memo.yaml")
    for out in ("a", "b"):
        progress = _Statuses()
        cases = run_suite(suite, tmp_path / out, progress=progress).result.cases
        assert [c.status for c in cases] == ["ok", "ok"]
        assert progress.lines.count("reference") == 1


def test_one_devices_table():
    from kvbench.backends import torch_backend
    from kvbench.suite import schema

    assert schema.check_device_name is torch_backend.check_device_name
    assert torch_backend.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="is not one of auto, cpu, cuda, cuda:N"):
        torch_backend.resolve_device("tpu")


# ---------------------------------------------------------------- resume


def _full_run(tmp_path, monkeypatch, suite=SUITES / "steps.yaml") -> Path:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = invoke("run", suite, "--out", out)
    assert result.exit_code == 0, result.output
    return out


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


def test_resume_after_only_the_claims_changed_judges_them_again(tmp_path, monkeypatch):
    """Claims judge measurements and do not change them: a suite whose claims alone changed
    resumes, runs nothing, and the finished cases get the new claims' verdicts."""
    suite = tmp_path / "steps.yaml"
    shutil.copy(SUITES / "steps.yaml", suite)
    out = _full_run(tmp_path, monkeypatch, suite)
    suite.write_text(suite.read_text().replace(
        "      i: [0, 1, 2, 3, 4]",
        "      i: [0, 1, 2, 3, 4]\n    claims: [\"value <= 2\", \"value - Nop == 0\"]"))
    (tmp_path / "cases.log").unlink()
    result = invoke("run", suite, "--out", out, "--resume")
    assert result.exit_code == 1, result.output  # i = 3 and 4 fail value <= 2
    assert "only the suite's claims or timeouts changed" in result.output
    assert not (tmp_path / "cases.log").exists()  # nothing ran
    cases = load_results(out / "results.json").cases
    verdicts = [[c.verdict for c in case.claims] for case in cases]
    assert verdicts == [["held", "held"]] * 3 + [["failed", "held"]] * 2
    assert load_results(out / "results.json").suite.hash == load_suite(suite).hash
    # resumed again: the same verdicts, nothing run
    assert invoke("run", suite, "--out", out, "--resume").exit_code == 1
    assert not (tmp_path / "cases.log").exists()


def test_resume_after_a_timeout_changed_runs_again_only_the_cases_it_stopped(tmp_path,
                                                                             monkeypatch):
    suite = tmp_path / "steps.yaml"
    suite.write_text((SUITES / "steps.yaml").read_text().replace(
        "  repeats: 1\n", "  repeats: 1\n  timeout_s: 1\n").replace(
        "      i: [0, 1, 2, 3, 4]", "      i: [0, 1]\n      sleep_s: [0.0, 3.0]").replace(
        "params: {log: cases.log, sleep_s: 0.0}", "params: {log: cases.log}"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert invoke("run", suite, "--out", out).exit_code == 3  # two cases time out
    statuses = {c.id: c.status for c in load_results(out / "results.json").cases}
    assert sorted(statuses.values()) == ["ok", "ok", "timeout", "timeout"]
    (tmp_path / "cases.log").unlink()
    # the same timeout: a stopped case would stop again, so nothing runs
    assert invoke("run", suite, "--out", out, "--resume").exit_code == 3
    assert not (tmp_path / "cases.log").exists()
    suite.write_text(suite.read_text().replace("timeout_s: 1\n", "timeout_s: 30\n"))
    result = invoke("run", suite, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    assert "2 case(s) stopped by the old timeout run again" in result.output
    assert logged(tmp_path / "cases.log") == [0, 1]  # the two 3-second cases, once each
    cases = load_results(out / "results.json").cases
    assert [c.status for c in cases] == ["ok"] * 4
    assert sorted(c.id for c in cases) == sorted(statuses)
    lines = jsonl_lines(out / "results.jsonl")  # one record a case
    assert sorted(line["case"]["id"] for line in lines[1:]) == sorted(statuses)
    assert load_results(out / "results.json").suite.hash == load_suite(suite).hash


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
    import kvbench.run.files

    monkeypatch.setattr(kvbench.run.files, "datetime", _FrozenClock)
    out = _full_run(tmp_path, monkeypatch)  # 5 cases
    for limit in ("1", "2"):
        assert invoke("run", SUITES / "steps.yaml", "--out", out, "--limit", limit).exit_code == 0
    archived = sorted(len(load_json(p)["cases"]) for p in out.glob("previous/*/results.json"))
    assert archived == [1, 5]  # both earlier runs kept (the current one has 2)


CARRIED_SUITE = """\
kvbench: 1
name: carried
defaults: {device: cpu}
methods:
  - {name: intq, params: {group_size: 16}, matrix: {bits: [2, 4]}}
benchmarks:
  - kind: proofs
    params: {n_vectors: 64, dim: 32, n_queries: 4}
"""


def test_a_case_runs_with_the_settings_its_suite_validated(tmp_path, monkeypatch):
    """The suite validates each setting once; its cases carry the objects built (pickled to a
    child process or a Ray worker as they are), so running them validates nothing again."""
    import dataclasses
    import pickle

    import kvbench.config.strict as strict

    (tmp_path / "carried.yaml").write_text(CARRIED_SUITE)
    suite = load_suite(tmp_path / "carried.yaml")
    assert [(c.settings.bits, c.settings.group_size, c.params.n_vectors) for c in suite.cases] \
        == [(2, 16, 64), (4, 16, 64)]
    for case in suite.cases:
        assert case.method_params == dataclasses.asdict(case.settings)
        assert case.bench_params == dataclasses.asdict(case.params)
        again = pickle.loads(pickle.dumps(case))
        assert (again.settings, again.params) == (case.settings, case.params)

    def validated(cls, params):
        raise AssertionError(f"{cls.__name__} validated again while running: {params}")
    monkeypatch.setattr(strict, "validate", validated)
    cases = run_suite(suite, tmp_path / "out").result.cases
    assert [c.status for c in cases] == ["ok", "ok"]
    assert cases[0].metrics["mse"].value > cases[1].metrics["mse"].value  # 2 bits, then 4
