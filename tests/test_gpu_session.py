"""ci/gpu_session.sh, the one device call of a GPU session, on this CPU: its plan puts the most
valuable unmeasured cases first, the committed CUDA run resumes with the suite as it is, and a
step stopped at its share keeps its finished cases while the next step still runs.

The stop is not timed by the test: the test benchmark blocks in its third case (KVB_BLOCK_AT)
until the script's own budget stops it, so what finished before is known exactly."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


from kvbench.run.case import Silent
from kvbench.run.runner import _resume_state, run_suite
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import jsonl_lines, logged
from tests.plugins.kvb_testplugin import BLOCK_AT
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S

SCRIPT = ROOT / "ci" / "gpu_session.sh"
COMMITTED = ROOT / "reports" / "cuda-e2e" / "results.jsonl"
# what a device run records without --repeats or --shard; the committed run's header says the same
CUDA = {"device": "cuda", "backend": "torch", "repeats": None, "shard": None}


def session(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The script with its folders in tmp_path and this interpreter; env adds variables."""
    full = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
            "RUN_ROOT": str(tmp_path / "runs"), "SITE": str(tmp_path / "site"),
            "WHEELS": str(tmp_path / "no-wheels"), "GGUF_DIR": str(tmp_path / "no-gguf"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=HANG_S)


def plan_lines(output: str) -> list[str]:
    return [line.split()[1] for line in output.splitlines() if line[:5].strip().endswith(".")]


def test_the_plan_runs_the_kernels_first_and_the_unmeasured_cuda_cases_most_valuable_first(
        tmp_path):
    done = session(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert plan_lines(done.stdout) == ["kernels", "cuda", "cuda-e2e", "cuda-e2e-bf16"]
    shares = [int(share) for share in re.findall(r" ~(\d+)s", done.stdout)]
    assert len(shares) == 3 and 500 <= sum(shares) <= 540 - 15  # under a call's 600 s
    assert shares[2] > shares[0] + shares[1]  # most of the call for the unmeasured cases
    assert "what is left" in done.stdout.splitlines()[4]  # bfloat16 only with the time left
    e2e = next(line for line in done.stdout.splitlines() if line.startswith("  cuda-e2e ("))
    assert "from reports/cuda-e2e" in e2e and "83 case(s): 47 kept, 36 to run" in e2e
    first = e2e.split("first: ")[1].split()[:6]
    assert first == [f"stress/{m}/users={u}" for u in (16, 64)
                     for m in ("identity", "intq-bits4", "turbo3")]
    assert "0 kept, 83 to run" in done.stdout  # bf16 has no committed run
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_a_seed_from_another_device_is_not_used(tmp_path):
    done = session(tmp_path, "--dry-run", DEVICE="cpu", STEPS="cuda-e2e")
    assert done.returncode == 0, done.stdout + done.stderr
    assert plan_lines(done.stdout) == ["cuda-e2e"]
    assert "83 case(s): 0 kept, 83 to run" in done.stdout  # the committed run was on cuda


def test_the_committed_run_resumes_with_the_suite_as_it_is_and_leaves_stress_niah_ruler(
        tmp_path):
    """Reordering suites/cuda-e2e.yaml would change what it measures: --resume would refuse
    the committed run, and the 47 cases measured would run again."""
    shutil.copy(COMMITTED, tmp_path / "results.jsonl")
    suite = load_suite(ROOT / "suites" / "cuda-e2e.yaml")
    _, kept = _resume_state(tmp_path, suite, CUDA, Silent())
    assert len(kept) == 47
    left = [case.id for case in suite.cases if case.id not in {c.id for c in kept}]
    groups = [c.split("/")[0] + ("/" + c.split("/")[2] if c.startswith("stress") else "")
              for c in left]
    assert groups == ["stress/users=16"] * 3 + ["stress/users=64"] * 3 + ["niah"] * 6 + [
        "ruler"] * 24
    bf16 = load_suite(ROOT / "suites" / "cuda-e2e-bf16.yaml")
    assert [c.id for c in bf16.cases] == [c.id for c in suite.cases]


def test_a_bad_plan_is_refused_before_anything_runs(tmp_path):
    done = session(tmp_path, PLAN="kernels pytest tests/test_kernels.py 10 -")
    assert done.returncode == 2 and "kind 'pytest'" in done.stderr
    assert not (tmp_path / "out").exists()


STEPS = """kvbench: 1
name: {name}
defaults: {{device: cpu, seed: 3, repeats: 1}}
methods:
  - name: tests.plugins.kvb_testplugin:Nop
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Step
    params: {{log: {log}, sleep_s: 0.0}}
    matrix: {{i: {cases}}}
"""


def test_a_step_over_its_share_keeps_its_finished_cases_and_the_next_step_runs(tmp_path):
    log = tmp_path / "cases.log"
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(STEPS.format(name="first", log=log, cases=[0, 1, 2, 3, 4]))
    second.write_text(STEPS.format(name="second", log=log, cases=[10, 11]))
    seed = tmp_path / "reports" / "first"  # as committed: case 0 measured before
    suite = load_suite(first)
    run_suite(suite, seed, cases=suite.cases[:1])
    assert logged(log) == [0]

    # case 2 blocks until the first step's share ends (its share less GRACE_S); the second
    # step then gets what is left. The shares leave room for a loaded machine: each step
    # starts an interpreter; GRACE_S lets a stopped run write results.json before it is killed,
    # generous because CI's other tests load the same two cores
    done = session(tmp_path, BUDGET_S="200", END_S="2", GRACE_S="40", MIN_S="5", DEVICE="cpu",
                   PLAN=f"first suite {first} 1 {seed / 'results.jsonl'}\n"
                        f"second suite {second} 2 -", **{BLOCK_AT: "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert plan_lines(done.stdout) == ["first", "second"]
    assert logged(log) == [0, 1, 2, 10, 11]  # case 0 kept from the seed, never run again

    out = tmp_path / "out"
    lines = jsonl_lines(out / "first" / "results.jsonl")
    assert [line["case"]["id"] for line in lines[1:]] == [
        f"tests.plugins.kvb_testplugin:Step/Nop/i={i}" for i in (0, 1)]
    assert lines[:2] == jsonl_lines(seed / "results.jsonl")  # the seed's lines as they were
    assert (out / "first" / "results.json").exists(), (
        done.stdout + (out / "first" / "run.log").read_text())
    stopped = json.loads((out / "first" / "results.json").read_text())
    assert stopped["interrupted"] is True and len(stopped["cases"]) == 2  # as Ctrl-C stops it
    assert "**interrupted**" in (out / "first" / "report.md").read_text()
    after = json.loads((out / "second" / "results.json").read_text())
    assert after["interrupted"] is False and len(after["cases"]) == 2

    summary = (out / "summary.txt").read_text()
    assert "first: stopped" in summary and "1 case(s) run now" in summary
    assert "5 case(s): 2 kept, 3 to run" in summary  # what is left, for the next session
    assert "second: done" in summary and "2 case(s) run now (exit 0); all 2 finished" in summary
    assert (out / "env.txt").exists() and (out / "session.log").read_text().startswith(
        "gpu_session: plan")
