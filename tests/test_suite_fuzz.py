"""The shipped suites, mutated by hypothesis: deleted and renamed keys, wrong types, out-of-range
values, unknown names and metrics, broken YAML, huge matrices. A mutation that must be refused
exits 2 with one `file:line: ` line per problem and runs nothing; one that may leave the suite
valid exits 0 or 2. Never a traceback, never another exit code. The same holds without torch
(in a child process where torch cannot be imported), where validate checks the same declarations
and must refuse every mutant that must be refused, out-of-range values included, word for word
as with torch.

Bounded for the default run: a fixed number of examples per kind of mutation, derandomized so
that CI sees the same inputs on every run.
"""
from __future__ import annotations

import copy
import functools
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.config.extras import missing_modules
from tests.plugins.cli_support import HIDDEN, invoke, torch_free_cli, wide_consoles  # noqa: F401
from tests.plugins.suites import ROOT, SHIPPED_SUITES

EXAMPLES = 50  # per kind of mutation
TORCH = not missing_modules("torch")  # `run` needs it

# A parameter value each built-in method or benchmark refuses, by parameter name (ranges are
# declared on their fields or checked in their check()).
OUT_OF_RANGE: dict[str, Any] = {
    "bits": 0, "group_size": 0, "context": -1, "continuation": 0, "n_vectors": 0, "dim": 0,
    "tokens": 0, "block": 0, "ratio": 1.5, "budget": 0, "window": -1, "residual": -1, "steps": 0,
    "greedy_tokens": -1, "top_k": 0, "layers": [-1], "block_size": 0, "sinks": -1, "kernel": 0,
    "recent": 1.5, "n_queries": 0, "max_new_tokens": 0, "chunk": -1, "warmup": -1,
    "decode_chunk": 0, "offset": -1, "calibration": -1, "trim": -1, "min_bits": 0,
    "base_bits": 0, "segment": 0, "outlier_fraction": 1.5, "task_tokens": 0, "ridge": -1.0,
    "dtype": "float8", "data": "nosuch", "rotation": "nosuch", "codebook": "nosuch",
    "axis": "nosuch",
}
# Settings of the suite itself, with a value out of range.
SUITE_OUT_OF_RANGE = [
    (("defaults", "repeats"), 0), (("defaults", "timeout_s"), -1), (("defaults", "timeout_s"), 0),
    (("defaults", "threads"), 0), (("defaults", "device"), "gpu"), (("defaults", "backend"), "jax"),
    (("gate", "default"), {"rel": -0.1}), (("gate", "default"), {"abs": -1}),
    (("gate", "default"), {}), (("kvbench",), 2),
]
BENCH_OUT_OF_RANGE = [("repeats", 0), ("timeout_s", -1), ("context_above_model", 10**6)]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml, where there: 10x faster
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
NAMES = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


@dataclass
class Mutant:
    text: str
    invalid: bool  # True: the suite must be refused, whatever else it holds
    what: str  # for a failing example's report


# ---- where to mutate --------------------------------------------------------------------------

def _in_shape(path: tuple) -> bool:
    """Paths of the suite's own structure, down to a parameter's value and a matrix's items:
    what lies inside a parameter's value is the method's business."""
    if len(path) >= 3 and path[0] in ("methods", "benchmarks") and path[2] in ("params", "matrix"):
        return len(path) <= (4 if path[2] == "params" else 5)
    return True


def _is_param(path: tuple) -> bool:
    return len(path) == 4 and path[0] in ("methods", "benchmarks") and path[2] in ("params", "matrix")


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    """Every key path and list index of the suite's structure."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = []
    for key, value in items:
        if _in_shape(path + (key,)):
            out += [path + (key,), *_paths(value, path + (key,))]
    return out


def _key_paths(data) -> list[tuple]:
    return [p for p in _paths(data) if not isinstance(p[-1], int)]


def _parent(data, path: tuple):
    node = data
    for part in path[:-1]:
        node = node[part]
    return node


def _dump(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def _required(path: tuple) -> bool:
    """Keys without which a suite or its entry is refused."""
    return (path in (("kvbench",), ("methods",), ("benchmarks",))
            or path[0] == "methods" and path[2:] == ("name",)
            or path[0] == "benchmarks" and path[2:] == ("kind",)
            or path[0] == "benchmarks" and len(path) == 5 and path[2] == "claims"
            and path[4] == "claim")  # a scoped claim needs its claim (its cases: default all)


# ---- mutations: each takes hypothesis' draw, the seed's text and its data -----------------------

def delete_key(draw, text: str, data) -> Mutant:
    path = draw(st.sampled_from(_key_paths(data)))
    del _parent(data, path)[path[-1]]
    return Mutant(_dump(data), _required(path), f"deleted {path}")


def rename_key(draw, text: str, data) -> Mutant:
    path = draw(st.sampled_from(_key_paths(data)))
    new = "zz_" + draw(NAMES)
    parent = _parent(data, path)
    renamed = {new if k == path[-1] else k: v for k, v in parent.items()}
    parent.clear()
    parent.update(renamed)
    return Mutant(_dump(data), True, f"renamed {path} to {new!r}")


def _wrong_values(value) -> list:
    """Values no field that holds `value` accepts (a float field may hold an int: not that)."""
    if isinstance(value, bool):
        return ["wrong", 7, 2.5, [1], {"a": 1}]
    if isinstance(value, (int, float)):
        return ["wrong", "7", True, [1], {"a": 1}]
    if isinstance(value, str):
        return [7, 2.5, True, [1], {"a": 1}]
    if isinstance(value, list):
        return ["wrong", 7, {"a": 1}]
    return ["wrong", 7, [1]]  # a mapping


def wrong_type(draw, text: str, data) -> Mutant:
    paths = [p for p in _paths(data) if _parent(data, p)[p[-1]] is not None]
    params = [p for p in paths if _is_param(p) or len(p) == 5 and _is_param(p[:4])]
    path = draw(st.sampled_from(params) | st.sampled_from(paths))  # parameters: half the time
    parent = _parent(data, path)
    parent[path[-1]] = draw(st.sampled_from(_wrong_values(parent[path[-1]])))
    return Mutant(_dump(data), True, f"{path} = {parent[path[-1]]!r}")


def out_of_range(draw, text: str, data) -> Mutant:
    params = [p for p in _paths(data) if _is_param(p) and p[-1] in OUT_OF_RANGE]
    choices = ([("param", p) for p in params] + [("suite", s) for s in SUITE_OUT_OF_RANGE]
               + [("bench", (i, s)) for i in range(len(data["benchmarks"]))
                  for s in BENCH_OUT_OF_RANGE])
    kind, where = draw(st.sampled_from(choices))
    if kind == "param":
        parent = _parent(data, where)
        if where[-2] == "matrix":  # one value of the matrix
            index = draw(st.integers(0, len(parent[where[-1]]) - 1))
            parent[where[-1]][index] = OUT_OF_RANGE[where[-1]]
        else:
            parent[where[-1]] = OUT_OF_RANGE[where[-1]]
    elif kind == "suite":
        path, value = where
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    else:
        index, (key, value) = where
        bench = data["benchmarks"][index]
        if key == "context_above_model":
            bench["kind"], bench["params"] = "perplexity", {"context": value}
            bench.pop("matrix", None)
            bench.pop("claims", None)
        else:
            bench[key] = value
    return Mutant(_dump(data), True, f"{kind} {where}")


def unknown_metric(draw, text: str, data) -> Mutant:
    metric = "zz_" + draw(NAMES)
    claim = f"{metric} {draw(st.sampled_from(['>=', '<=', '==', '<']))} 1"
    where = draw(st.sampled_from(["benchmark", "scoped", "method", "gate"]))
    if where == "gate":
        data.setdefault("gate", {}).setdefault("metrics", {})[metric] = {"rel": 0.1}
    else:
        entries = data["methods" if where == "method" else "benchmarks"]
        entry = entries[draw(st.integers(0, len(entries) - 1))]
        item = {"cases": "*", "claim": claim} if where == "scoped" else claim
        entry.setdefault("claims", []).append(item)
    return Mutant(_dump(data), True, f"{where} names {metric!r}")


def unknown_name(draw, text: str, data) -> Mutant:
    """A method, benchmark or selector that names nothing, `module:Class` paths included."""
    name = draw(st.text("abcdefghijklmnopqrstuvwxyz_:.-0123456789", min_size=1, max_size=10)
                .filter(lambda n: n not in KNOWN))
    where = draw(st.sampled_from(["methods", "benchmarks", "selector"]))
    if where == "selector":  # "zz": not a method label of the suite
        entry = data["benchmarks"][draw(st.integers(0, len(data["benchmarks"]) - 1))]
        entry["methods"] = [*(entry.get("methods") or []), "zz" + name]
    else:
        entry = data[where][draw(st.integers(0, len(data[where]) - 1))]
        entry["name" if where == "methods" else "kind"] = name
    return Mutant(_dump(data), True, f"{where} named {name!r}")


def broken_yaml(draw, text: str, data) -> Mutant:
    """Text YAML cannot read, or (cut short) may still read."""
    lines = text.splitlines()
    body = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    keyed = re.compile(r"^( *)[A-Za-z_]\w*: \S")
    flows = [i for i in body if lines[i].rstrip().endswith(("}", "]"))]
    nested = [i for i in body if lines[i].startswith(" ")]
    siblings = [j for i, j in zip(body, body[1:]) if keyed.match(lines[i]) and keyed.match(lines[j])
                and len(keyed.match(lines[i])[1]) == len(keyed.match(lines[j])[1])]
    op = draw(st.sampled_from(["unclosed bracket", "tab indent", "over-indented", "control byte",
                               "duplicate key", "truncated"]))
    if op == "truncated":
        cut = draw(st.integers(0, len(text)))
        return Mutant(text[:cut], False, f"truncated at {cut}")
    if op == "control byte":
        at = draw(st.integers(0, len(text)))
        return Mutant(text[:at] + "\x07" + text[at:], True, f"control byte at {at}")
    if op == "duplicate key":  # every shipped suite has a name
        return Mutant(text + f"name: {draw(NAMES)}\n", True, op)
    where = draw(st.sampled_from({"unclosed bracket": flows, "tab indent": nested,
                                  "over-indented": siblings}[op]))
    if op == "unclosed bracket":
        lines[where] = lines[where].rstrip()[:-1]
    elif op == "tab indent":
        lines[where] = "\t" + lines[where].lstrip(" ")
    else:
        lines[where] = " " + lines[where]
    return Mutant("\n".join(lines) + "\n", True, f"{op} at line {where + 1}")


def huge_matrix(draw, text: str, data) -> Mutant:
    """Far more cases than a suite may have, from one matrix or from methods x benchmark."""
    if draw(st.booleans()):
        keys, values = draw(st.integers(4, 10)), draw(st.integers(11, 12))
        where = draw(st.sampled_from(["methods", "benchmarks"]))
        entry = data[where][draw(st.integers(0, len(data[where]) - 1))]
        entry["matrix"] = {f"k{i}": list(range(values)) for i in range(keys)}
        return Mutant(_dump(data), True, f"{where} matrix {keys} keys x {values} values")
    per_method = draw(st.integers(101, 200))  # each entry under the limit, together over it
    data["methods"][0]["matrix"] = {"k0": list(range(per_method))}
    data["benchmarks"][0]["matrix"] = {"k1": list(range(100))}
    data["benchmarks"][0].pop("methods", None)
    return Mutant(_dump(data), True, f"{per_method} x 100 cases")


def _known_names() -> set[str]:
    from kvbench.benchmarks import BENCHMARKS
    from kvbench.methods import METHODS

    return set(METHODS.names()) | set(BENCHMARKS.names())


KNOWN = _known_names()


# ---- the property -----------------------------------------------------------------------------

@functools.cache
def _seed(path: Path) -> tuple[str, Any]:
    text = path.read_text()
    return text, yaml.load(text, Loader=_Loader)


# The mutations act on a suite's own methods and benchmarks: a suite made of an include and a
# default or two (suites/cuda-e2e-bf16.yaml) has none, and is mutated through the file it includes.
# An MLX suite is left out: the torch-free child hides MLX too, so it is refused there whole
# (tests/test_torch_free.py checks that).
SEEDS = [path for path in SHIPPED_SUITES
         if {"methods", "benchmarks"} <= set(yaml.safe_load(path.read_text()))
         and (yaml.safe_load(path.read_text()).get("defaults") or {}).get("backend") != "mlx"]


@st.composite
def mutants(draw, mutation: Callable) -> Mutant:
    seed = draw(st.sampled_from(SEEDS))
    text, data = _seed(seed)
    mutant = mutation(draw, text, copy.deepcopy(data))
    mutant.what = f"{seed.relative_to(ROOT)}: {mutant.what}"
    return mutant


def _validate(file: str, text: str, invoke=invoke):
    """`kvbench validate`: exit 0 saying so, or exit 2 naming file:line for each problem."""
    result = invoke("validate", file)
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        assert result.stdout.startswith("valid: ")
    else:
        _assert_refused(result, file, text)
    return result


def _assert_refused(result, file: str, text: str) -> None:
    """Exit 2, a header, then one `file:line: ` line per problem, each line inside the file."""
    assert result.exit_code == 2, result.output
    header, *problems = result.stderr.splitlines()
    assert header == f"invalid suite ({len(problems)} problem(s)):", result.stderr
    last = max(1, len(text.splitlines()))
    for problem in problems:
        match = re.match(rf"  {re.escape(file)}:(\d+): \S", problem)
        assert match, problem
        assert 1 <= int(match[1]) <= last, problem


@pytest.mark.parametrize("mutation", [
    delete_key, rename_key, wrong_type, out_of_range, unknown_metric, unknown_name, broken_yaml,
    huge_matrix,
], ids=lambda m: m.__name__)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_suite_is_refused_cleanly(mutation, data, torch_free_cli):
    mutant = data.draw(mutants(mutation))
    with tempfile.TemporaryDirectory() as folder:
        file = str(Path(folder) / "suite.yaml")
        Path(file).write_text(mutant.text, encoding="utf-8")
        validated = _validate(file, mutant.text)
        assert validated.exit_code == 2 or not mutant.invalid, mutant.what
        without_torch = _validate(file, mutant.text, torch_free_cli.invoke)
        assert not set(HIDDEN) & set(without_torch.imported)
        if mutant.invalid:  # out-of-range values too: the declarations hold the ranges
            assert without_torch.exit_code == 2, mutant.what
        assert (without_torch.exit_code, without_torch.stdout, without_torch.stderr) == (
            validated.exit_code, validated.stdout, validated.stderr), mutant.what
        if mutant.invalid and TORCH:  # `run` refuses it the same way, before anything runs
            with mock.patch("kvbench.run.runner.run_suite", side_effect=AssertionError("ran")):
                ran = invoke("run", file, "--out", Path(folder) / "out")
            assert ran.stderr == validated.stderr, mutant.what
            assert not (Path(folder) / "out").exists()
