"""What the CLI prints to a pipe (a CI log, `| tee`, `> file`) is not wrapped at rich's 80
columns: a case id, a table row, stays on its line; and a finished case's line counts the claims
judged at the end of the run. Each command runs as a real process with stdout piped and no
COLUMNS set, as in a log."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kvbench.config import describe
from kvbench.methods import METHODS
from tests.plugins.extras import needs
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S

LONG_LABEL = "nop-with-a-label-long-enough-that-its-case-id-runs-past-eighty-columns"
SUITE = f"""\
kvbench: 1
name: piped
defaults: {{device: cpu, repeats: 1}}
methods:
  - name: tests.plugins.kvb_testplugin:Nop
    label: plain
  - name: tests.plugins.kvb_testplugin:Nop
    label: {LONG_LABEL}
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Step
    params: {{i: 1}}
    claims:
      - {{cases: "*/{LONG_LABEL}", claim: "value <= 3"}}
      - {{cases: "*/{LONG_LABEL}", claim: "value - plain <= 0"}}
      - {{cases: "*/{LONG_LABEL}", claim: "value - plain >= 0"}}
"""


def _piped(args: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "kvbench.cli", *map(str, args)], cwd=cwd,
                          env=env, text=True, capture_output=True, timeout=HANG_S)


def test_list_methods_keeps_each_description_on_its_row(tmp_path):
    done = _piped(["list", "methods"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in METHODS.names():
        description = describe.first_sentence(describe.docstring(METHODS.get(name)))
        assert any(line.startswith(f"│ {name} ") and description in line for line in lines), (
            name, description)


@needs("torch")  # run asks for it first
def test_a_long_case_id_and_its_claims_stay_on_one_line(tmp_path):
    (tmp_path / "s.yaml").write_text(SUITE)
    done = _piped(["run", "s.yaml", "--out", tmp_path / "out"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    case_id = f"tests.plugins.kvb_testplugin:Step/{LONG_LABEL}"
    assert len(f"ok {case_id}") > 80  # what this test is about
    # one own claim, judged as the case ends; two against the plain case, at the run's end
    finished = rf"^ok {re.escape(case_id)} \(\d+\.\d s\)  claims 1/1, 2 judged at the end$"
    assert re.search(finished, done.stdout, re.M), done.stdout
    assert "claims held 3/3" in done.stdout
