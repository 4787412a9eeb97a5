"""Running the CLI for tests: in-process, as a real process that can be signalled, or in a
child process where torch and the other optional extras cannot be imported."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from kvbench import cli
from kvbench.cli import common as consoles
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S


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


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = HANG_S) -> None:
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


# Not installed by `pip install kvbench`. matplotlib (kvbench[plots]) too: `report` of a run with
# proofs cases imports it where it is installed, and must print its note where it is not.
HIDDEN = ("torch", "transformers", "mlx", "mlx_lm", "matplotlib")

# The start of a child's code: HIDDEN cannot be imported there, as if they were not installed;
# `started` holds the modules the interpreter started with.
HIDE = textwrap.dedent(f"""
    import importlib.util, json, os, sys
    started = set(sys.modules)

    class Hidden:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {HIDDEN!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

    sys.meta_path.insert(0, Hidden())
    found = importlib.util.find_spec

    def find_spec(name, package=None):
        # as where the module is absent: None for it, a parent's error for its submodules (a
        # library that asks before it imports, as `datasets` asks for torch, goes on)
        top = name.partition(".")[0]
        if top in {HIDDEN!r}:
            if top == name:
                return None
            raise ModuleNotFoundError(f"No module named {{top!r}}", name=top)
        return found(name, package)

    importlib.util.find_spec = find_spec
""")

# A child that runs one command line per line of its stdin (a JSON list of arguments) through
# CliRunner, as invoke() does here, and answers with one JSON line: the exit code, stdout, stderr
# and the top-level modules imported so far.
_SERVE = HIDE + textwrap.dedent("""
    from click.testing import CliRunner
    from kvbench import cli
    from kvbench.cli import common as consoles

    for console in (consoles.console, consoles.err):
        console.width = 1000
    for line in sys.stdin:
        result = CliRunner().invoke(cli.main, json.loads(line), catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback
            stderr = result.stderr + "Traceback: " + "".join(
                traceback.format_exception(result.exception))
        else:
            stderr = result.stderr
        imported = sorted({m.partition(".")[0] for m in set(sys.modules) - started})
        print(json.dumps({"exit_code": result.exit_code, "stdout": result.stdout,
                          "stderr": stderr, "imported": imported}), flush=True)
""")


class TorchFreeCLI:
    """One child process without HIDDEN, running command lines as invoke() runs them here
    (so their output can be compared): many commands for the cost of one start."""

    def __init__(self):
        env = {**os.environ, "COLUMNS": "1000"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE], cwd=ROOT, env=env,
                                     text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def invoke(self, *args) -> SimpleNamespace:
        """exit_code, stdout, stderr, output (both) and imported (top-level modules so far)."""
        self.proc.stdin.write(json.dumps([str(a) for a in args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the torch-free child exited ({self.proc.wait()})")
        answer = json.loads(line)
        return SimpleNamespace(**answer, output=answer["stdout"] + answer["stderr"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def torch_free_cli():
    """A TorchFreeCLI for the module."""
    child = TorchFreeCLI()
    yield child
    child.close()
