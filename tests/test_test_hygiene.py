"""No test asserts on a stopwatch: a busy machine makes a test slow, never wrong. A test waits
for an event with a limit that only catches a hang (tests/plugins/waits.py); a speed target
is a suite's claim, judged by a benchmark.

An assert is a stopwatch when it reads an elapsed time: a clock reading minus another
(`time.perf_counter() - start`), or a name that holds one (`took = ...; assert took < 5`). A
deadline checked while waiting (`assert time.monotonic() < deadline`) subtracts nothing and is
not one."""
from __future__ import annotations

import ast
import textwrap
import pytest

from tests.plugins.suites import ROOT

TESTS = ROOT / "tests"
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
          "process_time", "process_time_ns"}
BARE_CLOCKS = CLOCKS - {"time"}  # `time()` alone is too common a name to be sure of

# Stopwatch asserts in tests of other modules, each to be made an event wait by its owner;
# an entry that no longer offends must be removed (checked below).
OUTSTANDING: dict[str, str] = {}  # a known stopwatch left for later, with the reason


def _is_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in BARE_CLOCKS


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _reads_clock(node: ast.AST, started: set[str]) -> bool:
    return any(_is_clock(n) for n in ast.walk(node)) or bool(_names(node) & started)


def _elapsed(node: ast.AST, started: set[str], elapsed: set[str]) -> bool:
    """Whether `node` computes or holds an elapsed time."""
    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and (
                _reads_clock(n.left, started) or _reads_clock(n.right, started)):
            return True
    return bool(_names(node) & elapsed)


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own(scope: ast.AST) -> list[ast.AST]:
    """The nodes of `scope`, without those of the functions defined inside it (scanned as
    scopes of their own)."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(node))
    return out


def stopwatch_asserts(source: str) -> list[tuple[str, int]]:
    """(the enclosing function, line) of every assert on an elapsed time in `source`."""
    found = []
    tree = ast.parse(source)
    scopes = [("<module>", tree)] + [(n.name, n) for n in ast.walk(tree)
                                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for name, scope in scopes:
        started: set[str] = set()  # names that hold a clock reading (a start, a deadline)
        elapsed: set[str] = set()  # names that hold a difference of readings
        body = [n for n in _own(scope) if isinstance(n, (ast.Assign, ast.AnnAssign,
                                                        ast.AugAssign, ast.Assert))]
        for node in sorted(body, key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Assert):
                if _elapsed(node.test, started, elapsed):
                    found.append((name, node.lineno))
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            held = {t.id for target in targets for t in ast.walk(target)
                    if isinstance(t, ast.Name)}
            if node.value is None:
                continue
            if _elapsed(node.value, started, elapsed):
                elapsed |= held
            elif _reads_clock(node.value, started):
                started |= held
    return found


@pytest.fixture(scope="module")
def offenders() -> dict[str, list[int]]:
    """The lines of the stopwatch asserts of every file of tests/, by "path::function"."""
    out: dict[str, list[int]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if "data" in path.relative_to(TESTS).parts:  # the example plug-in's own package
            continue
        for function, line in stopwatch_asserts(path.read_text()):
            out.setdefault(f"{path.relative_to(ROOT).as_posix()}::{function}", []).append(line)
    return out


def test_no_test_asserts_on_a_stopwatch(offenders):
    new = {where: lines for where, lines in offenders.items() if where not in OUTSTANDING}
    assert not new, ("assert on an elapsed time (wait for the event instead, with "
                     f"tests.plugins.waits.HANG_S as its limit): {new}")


def test_every_outstanding_entry_still_offends(offenders):
    fixed = set(OUTSTANDING) - set(offenders)
    assert not fixed, f"no longer a stopwatch: remove from OUTSTANDING: {sorted(fixed)}"


def test_the_scan_finds_a_stopwatch_and_passes_a_deadline():
    source = textwrap.dedent("""
        import time
        from time import perf_counter

        def test_timed():
            start = time.perf_counter()
            work()
            assert time.perf_counter() - start < 10

        def test_took():
            started = perf_counter()
            work()
            took = perf_counter() - started
            assert took < 5, took

        def test_waits():
            deadline = time.monotonic() + 30
            while not done():
                assert time.monotonic() < deadline, "hung"
            result = run()
            assert result.duration_s >= 0
            elapsed = 3  # not from a clock
            assert elapsed == 3
    """)
    assert stopwatch_asserts(source) == [("test_timed", 8), ("test_took", 14)]
