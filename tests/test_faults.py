"""Faults lose nothing: a run interrupted (SIGINT, SIGTERM) or killed (SIGKILL) mid-case, a
results.jsonl cut mid-line or corrupt, two runs into one folder, a full disk, a broken baseline.

Real processes are stopped while a case is blocked (the test plugin's KVB_BLOCK_AT), never
after a sleep, so no test depends on timing luck; every wait is for an event, its limit only
catching a hang (HANG_S).
"""
from __future__ import annotations

import errno
import json
import shlex
import signal
import time
from pathlib import Path

import pytest

import kvbench.results
from tests.plugins.cli_support import invoke, jsonl_lines, kvbench_process, logged, wait_until
from tests.plugins.kvb_testplugin import BLOCK_AT
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S

SUITE = ROOT / "tests" / "suites" / "cli" / "steps.yaml"  # five cases, each logs its index
STEP_IDS = [f"tests.plugins.kvb_testplugin:Step/Nop/i={i}" for i in range(5)]


def deterministic(case: dict) -> dict:
    """What two runs of a case must agree on: everything but clocks and timings."""
    return {key: case[key] for key in ("id", "status", "metrics", "claims", "fingerprint",
                                       "comparable", "warnings")}


@pytest.fixture
def reference(tmp_path_factory) -> list[dict]:
    """The cases of an uninterrupted run."""
    folder = tmp_path_factory.mktemp("reference")
    proc = kvbench_process(["run", SUITE, "--out", folder / "out"], folder)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, output
    return [deterministic(c) for c in json.loads((folder / "out" / "results.json").read_text())["cases"]]


def _stop_mid_case(tmp_path: Path, stop) -> tuple[Path, str, int]:
    """Run the suite until case 2 has started (and blocks), then stop it with `stop(proc)`."""
    out, log = tmp_path / "out", tmp_path / "cases.log"
    proc = kvbench_process(["run", SUITE, "--out", out], tmp_path, **{BLOCK_AT: "2"})
    wait_until(lambda: logged(log) == [0, 1, 2], proc, "case 2 started", timeout=HANG_S)
    stop(proc)
    output, _ = proc.communicate(timeout=HANG_S)
    return out, output, proc.returncode


def _resume(tmp_path: Path, out: Path) -> str:
    proc = kvbench_process(["run", SUITE, "--out", out, "--resume"], tmp_path)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, output
    return output


@pytest.mark.parametrize("stop", [
    signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)], ids=["sigint", "sigterm"])
def test_a_stop_mid_case_keeps_the_finished_cases_and_resume_runs_the_rest(tmp_path, reference,
                                                                          stop):
    out, output, code = _stop_mid_case(tmp_path, lambda p: p.send_signal(stop))
    assert code == 130, output
    assert "interrupted" in output and f"--out {out} --resume" in output
    lines = jsonl_lines(out / "results.jsonl")
    assert [line["type"] for line in lines] == ["header", "case", "case"]
    interrupted = json.loads((out / "results.json").read_text())
    assert interrupted["interrupted"] is True
    assert [c["id"] for c in interrupted["cases"]] == STEP_IDS[:2]
    report = (out / "report.md").read_text()
    assert "**interrupted**" in report and "2 cases" in report

    output = _resume(tmp_path, out)
    assert "resuming: 2 finished case(s) kept, 3 to run" in output
    assert logged(tmp_path / "cases.log") == [0, 1, 2, 2, 3, 4]  # 0 and 1 never ran again
    final = json.loads((out / "results.json").read_text())
    assert final["interrupted"] is False
    assert [deterministic(c) for c in final["cases"]] == reference
    assert final["cases"][:2] == [line["case"] for line in lines[1:]]  # kept as they were


def test_a_stop_signalled_twice_at_once_as_timeout_signals_still_writes_what_finished(tmp_path):
    """timeout(1) signals the process and then its group: the second SIGINT, a millisecond
    later, once landed while results.json was being written and nothing but results.jsonl was
    left (CI's gpu_session test)."""
    def twice(proc):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.002)
        proc.send_signal(signal.SIGINT)

    out, output, code = _stop_mid_case(tmp_path, twice)
    assert code == 130, output
    interrupted = json.loads((out / "results.json").read_text())
    assert interrupted["interrupted"] is True
    assert [c["id"] for c in interrupted["cases"]] == STEP_IDS[:2]
    assert "**interrupted**" in (out / "report.md").read_text()


def test_the_resume_hint_keeps_the_filters_and_a_dry_run_says_what_it_would_run(tmp_path):
    """Interrupted with --only, the printed command resumes those cases and no others."""
    out, log = tmp_path / "out", tmp_path / "cases.log"
    proc = kvbench_process(["run", SUITE, "--out", out, "--only", "*i=[0-3]"], tmp_path,
                           **{BLOCK_AT: "2"})
    wait_until(lambda: logged(log) == [0, 1, 2], proc, "case 2 started", timeout=HANG_S)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, output
    hint = output.partition("Continue with:\n")[2].splitlines()[0].strip()
    assert hint == f"kvbench run {SUITE} --out {out} --only '*i=[0-3]' --resume"
    args = shlex.split(hint)[1:]
    listed = invoke(*args, "--dry-run")
    assert listed.exit_code == 0 and "4 case(s): 2 kept, 2 to run" in listed.output
    rows = [line for line in listed.output.splitlines() if "Step/Nop/i=" in line]
    assert [("kept" in row, "to run" in row) for row in rows] == [(True, False)] * 2 + [
        (False, True)] * 2
    proc = kvbench_process(args, tmp_path)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, output
    assert logged(log) == [0, 1, 2, 2, 3]  # case 4 was never asked for


def test_sigkill_mid_case_keeps_the_finished_cases_and_resume_runs_the_rest(tmp_path, reference):
    out, output, code = _stop_mid_case(tmp_path, lambda p: p.kill())
    assert code == -signal.SIGKILL
    lines = jsonl_lines(out / "results.jsonl")  # every line whole: each was fsynced
    assert [line["case"]["id"] for line in lines[1:]] == STEP_IDS[:2]
    assert not (out / "results.json").exists()  # no chance to write it
    shown = invoke("report", out / "results.jsonl")
    assert shown.exit_code == 0 and "**interrupted**" in shown.output

    output = _resume(tmp_path, out)  # the kill left no stuck lock either
    assert "resuming: 2 finished case(s) kept, 3 to run" in output
    assert logged(tmp_path / "cases.log") == [0, 1, 2, 2, 3, 4]
    final = json.loads((out / "results.json").read_text())
    assert [deterministic(c) for c in final["cases"]] == reference


def _finished_run(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = invoke("run", SUITE, "--out", out)
    assert result.exit_code == 0, result.output
    (tmp_path / "cases.log").unlink()
    return out


def test_a_line_cut_mid_write_is_dropped_with_a_message_and_its_case_runs_again(
        tmp_path, monkeypatch):
    out = _finished_run(tmp_path, monkeypatch)
    jsonl = out / "results.jsonl"
    lines = jsonl.read_text().splitlines(keepends=True)
    third = lines[3]  # header, case 0, case 1, then case 2 killed mid-write
    jsonl.write_text("".join(lines[:3]) + third[: len(third) // 2])
    result = invoke("run", SUITE, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    assert (f"{jsonl}: the last line was cut mid-write (case '{STEP_IDS[2]}'); it is dropped "
            "and that case runs again") in result.output
    assert "resuming: 2 finished case(s) kept" in result.output
    assert logged(tmp_path / "cases.log") == [2, 3, 4]
    parsed = jsonl_lines(jsonl)  # the half line is gone, not glued to the next one
    assert [line["case"]["id"] for line in parsed[1:]] == STEP_IDS


def test_a_line_cut_inside_a_multibyte_character_is_dropped_exactly(tmp_path, monkeypatch):
    out = _finished_run(tmp_path, monkeypatch)
    jsonl = out / "results.jsonl"
    lines = jsonl.read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[:3])
    cut = lines[3][:40] + "\u2265".encode()[:2]  # "≥" cut after 2 of its 3 bytes
    jsonl.write_bytes(kept + cut)
    result = invoke("run", SUITE, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    assert "the last line was cut mid-write" in result.output
    assert logged(tmp_path / "cases.log") == [2, 3, 4]
    assert jsonl.read_bytes().startswith(kept + b'{"type":"case"')  # nothing of the cut left
    assert [line["case"]["id"] for line in jsonl_lines(jsonl)[1:]] == STEP_IDS


def test_a_corrupt_line_before_the_end_is_refused_naming_it(tmp_path, monkeypatch):
    out = _finished_run(tmp_path, monkeypatch)
    jsonl = out / "results.jsonl"
    lines = jsonl.read_text().splitlines(keepends=True)
    lines[2] = '{"type": "case", "case": {"id": 7}}\n'
    jsonl.write_text("".join(lines))
    saved = jsonl.read_bytes()
    result = invoke("run", SUITE, "--out", out, "--resume")
    assert result.exit_code == 2
    assert f"{jsonl}:3: not a kvbench record (case.id: Input should be a valid string" in result.output
    assert not (tmp_path / "cases.log").exists() and jsonl.read_bytes() == saved


def test_a_second_run_into_the_same_folder_is_refused_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, log = tmp_path / "out", tmp_path / "cases.log"
    first = kvbench_process(["run", SUITE, "--out", out], tmp_path, **{BLOCK_AT: "0"})
    try:
        wait_until(lambda: logged(log) == [0], first, "the first run's case 0 started",
                   timeout=HANG_S)
        before = (out / "results.jsonl").read_bytes()
        second = invoke("run", SUITE, "--out", out)
        assert second.exit_code == 2
        assert f"{out} is in use by another kvbench run (pid {first.pid}" in second.output
        # refused before touching anything: nothing archived, nothing run, nothing written
        assert not (out / "previous").exists() and logged(log) == [0]
        assert (out / "results.jsonl").read_bytes() == before
    finally:
        first.kill()
        first.wait()
    # The kernel dropped the dead run's lock: the folder is usable again.
    again = invoke("run", SUITE, "--out", out, "--resume")
    assert again.exit_code == 0, again.output


def test_a_full_disk_stops_the_run_with_exit_3_and_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    real_fsync, calls = kvbench.results.os.fsync, []

    def full_after_three(fd):
        calls.append(fd)
        if len(calls) > 3:  # the header and two cases fit; then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(kvbench.results.os, "fsync", full_after_three)
    result = invoke("run", SUITE, "--out", out)
    assert result.exit_code == 3
    assert (f"cannot write {out / 'results.jsonl'}: No space left on device; the 2 case(s) saved"
            " before are kept in it") in result.output
    assert "--resume" in result.output
    assert logged(tmp_path / "cases.log") == [0, 1, 2]  # stopped after the case it lost
    lines = jsonl_lines(out / "results.jsonl")  # no half line left behind
    assert [line["case"]["id"] for line in lines[1:]] == STEP_IDS[:2]

    monkeypatch.setattr(kvbench.results.os, "fsync", real_fsync)  # space freed
    resumed = invoke("run", SUITE, "--out", out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert logged(tmp_path / "cases.log") == [0, 1, 2, 2, 3, 4]
    assert [c["id"] for c in json.loads((out / "results.json").read_text())["cases"]] == STEP_IDS


@pytest.mark.parametrize("damage, fault", [
    (lambda text: text[: len(text) // 2], "not valid JSON, truncated or corrupt (line "),
    (lambda text: "\x00\x01garbage", "not valid JSON, truncated or corrupt (line 1, column 1"),
    (lambda text: "", "not valid JSON, truncated or corrupt (line 1, column 1"),
    (lambda text: "[1, 2]", "not a kvbench results file (a JSON list without schema_version)"),
    (lambda text: "{}", "not a kvbench results file (an object without schema_version)"),
    (lambda text: text.replace('"schema_version": 2', '"schema_version": 99'),
     "schema_version 99; this kvbench reads 1 and 2"),
    (lambda text: text.replace('"status": "ok"', '"status": "fine"', 1),
     "not a kvbench results file (cases.0.status: Input should be 'ok', 'error', 'timeout' or 'refused'"),
])
def test_a_corrupt_or_truncated_baseline_exits_4_naming_the_file_and_the_fault(
        tmp_path, monkeypatch, damage, fault):
    out = _finished_run(tmp_path, monkeypatch)
    baseline = tmp_path / "baseline.json"
    assert invoke("baseline", "save", out / "results.json", "--to", baseline).exit_code == 0
    baseline.write_text(damage(baseline.read_text()))
    result = invoke("run", SUITE, "--out", tmp_path / "again", "--baseline", baseline)
    assert result.exit_code == 4
    assert f"baseline {baseline}: {fault}" in result.output
    assert not (tmp_path / "cases.log").exists()  # refused before anything ran
