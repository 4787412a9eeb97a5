"""validate, report, compare, merge and baseline save in an install without torch (`pip install kvbench`):
each command runs in a child process where torch, transformers, mlx, mlx_lm and matplotlib (the
optional extras) cannot be imported, and imports nothing the base dependencies do not bring. Without torch, validate checks
against the committed catalog of built-in methods and benchmarks, through the same code as with
the registries: the catalog must match them, and give the same cases and the same problems.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import kvbench.suite.loader as loader
from kvbench.catalog import CATALOG_FILE, NOTE, build_catalog
from kvbench.results import load_results
from kvbench.suite.errors import SuiteError
from tests.plugins.suites import ROOT, SHIPPED_SUITES, catalog_only
from tests.plugins.suites import SMALL_RESULTS as RESULTS
# Not installed by `pip install kvbench`. matplotlib (kvbench[plots]) too: `report` of a run with
# proofs cases imports it where it is installed, and must print its note where it is not.
HIDDEN = ("torch", "transformers", "mlx", "mlx_lm", "matplotlib")

# The child: hide HIDDEN as if they were not installed, run the command line, then write the
# top-level modules it imported (not those the interpreter started with) to $KVBENCH_IMPORTS.
_CHILD = textwrap.dedent(f"""
    import json, os, sys
    started = set(sys.modules)

    class Hidden:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {HIDDEN!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

    sys.meta_path.insert(0, Hidden())
    from kvbench.cli import main
    try:
        main(sys.argv[1:], prog_name="kvbench")
    finally:
        names = sorted({{m.partition(".")[0] for m in set(sys.modules) - started}})
        with open(os.environ["KVBENCH_IMPORTS"], "w") as out:
            json.dump(names, out)
""")

BAD_SUITE = """\
kvbench: 1
defaults: {model: bundled:smollm2-135m}
gate:
  metrics:
    cosin: {rel: 0.1}
methods:
  - name: intk
  - name: intq
    params: {bitz: 4}
  - name: turbo3
    params: {block: "64"}
    claims: ["bits >= 3"]
benchmarks:
  - kind: proofs
    claims: ["cosine >= 0.9", "cosinus >= 0.9"]
  - kind: perplexity
    params: {contxt: 512}
"""
# (key, line, words) of each problem of BAD_SUITE
BAD_PROBLEMS = [
    ("gate.metrics.cosin", 5, "Did you mean 'cosine'"),
    ("methods[0].name", 7, "unknown method 'intk'"),
    ("methods[1].params.bitz", 9, "unknown parameter 'bitz'"),
    ("methods[2].params.block", 11, "must be a valid integer, got text '64'"),
    ("methods[2].claims[0]", 12, "do not report metric 'bits'"),
    ("benchmarks[0].claims[1]", 15, "does not report metric 'cosinus'"),
    ("benchmarks[1].params.contxt", 17, "unknown parameter 'contxt' of benchmark 'perplexity'"),
]


def _kvbench(tmp_path: Path, *args) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the command line without torch: (the finished process, the modules it imported)."""
    imports = tmp_path / "imports.json"
    env = {**os.environ, "KVBENCH_IMPORTS": str(imports), "COLUMNS": "1000"}
    done = subprocess.run([sys.executable, "-c", _CHILD, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(imports.read_text())


# ---- the commands, without torch --------------------------------------------------------------

def test_validate_a_good_suite_without_torch_says_what_it_did_not_check(tmp_path):
    done, imported = _kvbench(tmp_path, "validate", ROOT / "suites" / "quick.yaml")
    assert done.returncode == 0, done.stderr
    cases = len(loader.load_suite(ROOT / "suites" / "quick.yaml").cases)  # with torch: the same
    assert f"valid: quick: {cases} case(s)" in done.stdout
    assert "note: " + NOTE in done.stdout
    assert not set(HIDDEN) & set(imported)


def test_validate_a_bad_suite_without_torch_names_file_line_and_key(tmp_path):
    suite = tmp_path / "bad.yaml"
    suite.write_text(BAD_SUITE)
    done, _ = _kvbench(tmp_path, "validate", suite)
    assert done.returncode == 2, done.stdout + done.stderr
    problems = re.findall(rf"^  {re.escape(str(suite))}:(\d+): (\S+): (.*)$", done.stderr, re.M)
    assert [(key, int(line)) for line, key, _ in problems] == [(k, n) for k, n, _ in BAD_PROBLEMS]
    for (_, _, message), (_, _, words) in zip(problems, BAD_PROBLEMS):
        assert words in message


def test_report_compare_and_baseline_save_without_torch(tmp_path):
    done, _ = _kvbench(tmp_path, "report", RESULTS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# kvbench: small")
    assert "rate-distortion plot skipped: matplotlib is not installed" in done.stdout
    baseline = tmp_path / "baseline.json"
    done, _ = _kvbench(tmp_path, "baseline", "save", RESULTS, "--to", baseline, "--allow-errors")
    assert done.returncode == 0, done.stderr
    assert load_results(baseline).cases == load_results(RESULTS).cases
    done, _ = _kvbench(tmp_path, "compare", RESULTS, baseline)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# kvbench compare: small")
    done, _ = _kvbench(tmp_path, "compare", baseline, RESULTS, "--gate")
    assert done.returncode == 3, done.stderr  # the gate's exit: RESULTS holds a crashed case


def test_merge_without_torch(tmp_path):
    from tests.test_shard import _shards, _write_suite

    shards = _shards(tmp_path, _write_suite(tmp_path), 2)  # run with torch, merged without
    done, imported = _kvbench(tmp_path, "merge", *shards, "--out", tmp_path / "merged")
    assert done.returncode == 0, done.stderr
    assert len(load_results(tmp_path / "merged/results.json").cases) == 15
    assert not set(HIDDEN) & set(imported)


def test_run_without_torch_says_what_to_install(tmp_path):
    done, _ = _kvbench(tmp_path, "run", ROOT / "suites" / "quick.yaml", "--out", tmp_path / "out")
    assert done.returncode == 2
    assert "kvbench run needs torch" in done.stderr and "kvbench[torch]" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [
    ("validate", ROOT / "suites" / "quick.yaml"),
    ("report", RESULTS),
    ("compare", RESULTS, RESULTS),
])
def test_base_dependencies_cover_what_the_commands_import(tmp_path, args):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    done, imported = _kvbench(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    allowed, todo = set(), [Requirement(r).name for r in project["dependencies"]]
    while todo:  # the base dependencies and everything they require (extras left out)
        name = canonicalize_name(todo.pop())
        if name not in allowed:
            allowed.add(name)
            for text in metadata.requires(name) or []:
                req = Requirement(text)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    todo.append(req.name)
    owners = metadata.packages_distributions()
    third_party = [m for m in imported if m in owners and m not in sys.stdlib_module_names]
    unlisted = {m: owners[m] for m in third_party
                if "kvbench" not in owners[m]
                and not {canonicalize_name(d) for d in owners[m]} & allowed}
    assert not unlisted, f"imported, but not from a base dependency: {unlisted}"


# ---- the catalog ------------------------------------------------------------------------------

def test_committed_catalog_is_what_the_registries_give():
    # After changing a built-in method or benchmark: python -m kvbench.catalog
    committed = json.loads(CATALOG_FILE.read_text())
    try:
        built = build_catalog()
    except ImportError:  # no MLX here: which methods run on it cannot be told, take the file's
        built = build_catalog(has_mlx=lambda cls: committed["methods"].get(cls.name, {}).get("mlx"))
    assert json.loads(json.dumps(built)) == committed


@pytest.mark.parametrize("path", SHIPPED_SUITES, ids=lambda p: p.name)
def test_catalog_gives_the_same_cases_as_the_registries(path):
    if path.name == "cuda.yaml":
        pytest.importorskip("triton", reason="its methods ask for impl triton")
    real = loader.load_suite(path)
    with catalog_only():  # load_suite checks against the catalog's stand-ins, as without torch
        stand_in = loader.load_suite(path)
    assert stand_in.cases == real.cases
    assert (stand_in.hash, real.note, stand_in.note) == (real.hash, "", NOTE)


def test_catalog_finds_the_same_problems_as_the_registries(tmp_path):
    suite = tmp_path / "bad.yaml"
    suite.write_text(BAD_SUITE)
    with pytest.raises(SuiteError) as real:
        loader.load_suite(suite)
    with catalog_only(), pytest.raises(SuiteError) as stand_in:
        loader.load_suite(suite)
    assert stand_in.value.issues == real.value.issues
    assert [(i.key, i.line) for i in real.value.issues] == [(k, n) for k, n, _ in BAD_PROBLEMS]
