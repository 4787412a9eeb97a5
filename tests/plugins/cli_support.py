"""Running the CLI for tests: in-process, or as a real process that can be signalled."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench import cli
from kvbench.cli import common as consoles
from tests.plugins.suites import ROOT


@pytest.fixture(autouse=True, scope="module")
def wide_consoles():
    """rich wraps at 80 columns without a terminal; keep file:line and case ids on one line."""
    saved = [(c, c._width) for c in (consoles.console, consoles.err)]
    for console, _ in saved:
        console.width = 1000
    yield
    for console, width in saved:
        console._width = width


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def _default_sigint():
    # A child inherits an ignored SIGINT (e.g. from a background CI job); Python then never
    # raises KeyboardInterrupt. Restore the default so the child behaves as on a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kvbench_process(args: list, cwd: Path, **env) -> subprocess.Popen:
    """`kvbench ARGS` as a child process (the repo on PYTHONPATH, so suites find the test
    plugins); keyword arguments are extra environment variables."""
    full_env = {**os.environ, **env, "COLUMNS": "300"}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", *map(str, args)], cwd=cwd, env=full_env,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_default_sigint,
    )


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    """Poll `condition()` until true; fail if the process ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.02)


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


def jsonl_lines(path: Path) -> list[dict]:
    """Every line must parse: a torn or garbled line fails the test."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def logged(path: Path) -> list[int]:
    """The case indices the Step benchmark appended to its log, in order."""
    return [int(x) for x in path.read_text().split()] if path.exists() else []
