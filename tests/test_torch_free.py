"""validate, report, compare, merge and baseline save in an install without torch (`pip install kvbench`):
each command runs in a child process where torch, transformers, mlx, mlx_lm and matplotlib (the
optional extras) cannot be imported, and imports nothing the base dependencies do not bring. Without torch, validate checks
against the real, torch-free declarations of the built-in methods and benchmarks
(kvbench.methods.settings, kvbench.benchmarks.specs), parameter ranges included: it must give the
same cases and the same problems as with torch.
"""
from __future__ import annotations

import dataclasses
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
from kvbench.results import load_results
from kvbench.suite.errors import SuiteError
from tests.plugins.cli_support import HIDDEN, HIDE, invoke, wide_consoles  # noqa: F401
from tests.plugins.extras import needs
from tests.plugins.suites import ROOT, SHIPPED_SUITES, line_of
from tests.plugins.suites import SMALL_RESULTS as RESULTS

# The child: HIDDEN cannot be imported (as if they were not installed, tests.plugins.cli_support),
# run the command line, then write the top-level modules it imported (not those the interpreter
# started with) to $KVBENCH_IMPORTS.
_CHILD = HIDE + textwrap.dedent("""
    from kvbench.cli import main
    try:
        main(sys.argv[1:], prog_name="kvbench")
    finally:
        names = sorted({m.partition(".")[0] for m in set(sys.modules) - started})
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

def test_validate_a_good_suite_without_torch_checks_it_as_with_torch(tmp_path):
    done, imported = _kvbench(tmp_path, "validate", ROOT / "suites" / "quick.yaml")
    assert done.returncode == 0, done.stderr
    cases = len(loader.load_suite(ROOT / "suites" / "quick.yaml").cases)  # with torch: the same
    assert f"valid: quick: {cases} case(s)" in done.stdout
    # the declarations are the real ones: nothing is left unchecked, so there is no note of it
    # (the catalog's "note: validated against the catalog ..." is gone with the catalog)
    assert "note:" not in done.stdout
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


def test_validate_reads_a_hub_models_config_without_torch(tmp_path, monkeypatch):
    """A hub id is validated from its config.json alone, fetched through huggingface_hub (a base
    dependency), from a stand-in of the hub here."""
    from tests.plugins.hub_standin import HubStandIn, point_kvbench_at

    config = {"model_type": "llama", "max_position_embeddings": 2048, "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    suite = tmp_path / "hub.yaml"
    suite.write_text("kvbench: 1\ndefaults: {model: kvb-test/config-only}\nmethods:\n"
                     "  - name: intq\nbenchmarks:\n  - kind: perplexity\n"
                     "    params: {context: 4096}\n")
    with HubStandIn() as hub:
        point_kvbench_at(hub, monkeypatch, tmp_path / "hf-cache")
        hub.add_model("kvb-test/config-only", {"config.json": json.dumps(config).encode(),
                                               "model.safetensors": b"not read"})
        done, imported = _kvbench(tmp_path, "validate", suite)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "tokens is above the 2048 that model kvb-test/config-only" in done.stderr
    assert hub.downloaded() == ["kvb-test/config-only/config.json"]
    assert "huggingface_hub" in imported and not set(HIDDEN) & set(imported)


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


@needs("torch")  # the shards are run with it, then merged without
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
    # kvbench, and plug-ins installed beside it (their entry points load with the registries)
    ours = {"kvbench"} | {ep.dist.name for group in ("kvbench.methods", "kvbench.benchmarks")
                          for ep in metadata.entry_points(group=group)}
    third_party = [m for m in imported if m in owners and m not in sys.stdlib_module_names]
    unlisted = {m: owners[m] for m in third_party
                if not set(owners[m]) & ours
                and not {canonicalize_name(d) for d in owners[m]} & allowed}
    assert not unlisted, f"imported, but not from a base dependency: {unlisted}"


# ---- the declarations, without torch and with it --------------------------------------------

# Every setting here is out of its declared range or breaks a rule across fields: what only the
# methods' and benchmarks' own code could refuse while validation without torch had a catalog.
RANGE_SUITE = """\
kvbench: 1
defaults: {model: bundled:smollm2-135m}
methods:
  - name: intq
    params: {bits: 9}
  - name: kivi
    matrix: {bits: [2, 3]}
  - name: kivi
    label: kivi-residual
    params: {group_size: 32, residual: 40}
benchmarks:
  - kind: proofs
    params: {n_vectors: 0}
  - kind: perplexity
    params: {context: 100000}
"""

# Loads each suite named on the command line without torch and prints, per suite, its hash and
# cases, or its issues: what _loaded() gives with torch.
_LOAD = HIDE + textwrap.dedent("""
    import dataclasses
    from kvbench.suite.errors import SuiteError
    from kvbench.suite.loader import load_suite

    out = {}
    for path in sys.argv[1:]:
        try:
            suite = load_suite(path)
            out[path] = {"hash": suite.hash, "cases": [dataclasses.asdict(c) for c in suite.cases]}
        except SuiteError as exc:
            out[path] = {"issues": [dataclasses.asdict(i) for i in exc.issues]}
    out["imported"] = sorted({m.partition(".")[0] for m in set(sys.modules) - started})
    print(json.dumps(out, default=repr))
""")


def _loaded(path) -> dict:
    """With torch: what _LOAD prints for one suite."""
    try:
        suite = loader.load_suite(path)
        found = {"hash": suite.hash, "cases": [dataclasses.asdict(c) for c in suite.cases]}
    except SuiteError as exc:
        found = {"issues": [dataclasses.asdict(i) for i in exc.issues]}
    return json.loads(json.dumps(found, default=repr))


def _loaded_without_torch(*paths) -> dict:
    done = subprocess.run([sys.executable, "-c", _LOAD, *map(str, paths)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    loaded = json.loads(done.stdout)
    assert not set(HIDDEN) & set(loaded.pop("imported"))
    return loaded


@pytest.fixture(scope="module")
def shipped_without_torch() -> dict:
    """Every shipped suite loaded without torch, in one child process."""
    return _loaded_without_torch(*SHIPPED_SUITES)


@pytest.mark.parametrize("path", SHIPPED_SUITES, ids=lambda p: p.name)
def test_without_torch_validate_gives_the_same_cases_as_with_torch(path, shipped_without_torch):
    if path.name == "cuda.yaml":
        pytest.importorskip("triton", reason="its methods ask for impl triton")
    real = _loaded(path)
    missing = [i["message"] for i in real.get("issues", []) if "extra (no module" in i["message"]]
    if missing:
        pytest.skip(missing[0])  # its benchmarks need an extra not installed here
    assert "cases" in real, real  # a shipped suite is valid
    if real["cases"][0]["backend"] == "mlx":  # the child hides MLX too: refused, naming it
        issues = shipped_without_torch[str(path)]["issues"]
        assert [i["key"] for i in issues] == ["defaults.backend"]
        assert "backend 'mlx' needs MLX" in issues[0]["message"]
        return
    assert shipped_without_torch[str(path)] == real


def test_without_torch_validate_finds_the_same_problems_as_with_torch(tmp_path):
    bad, ranges = tmp_path / "bad.yaml", tmp_path / "ranges.yaml"
    bad.write_text(BAD_SUITE)
    ranges.write_text(RANGE_SUITE)
    without_torch = _loaded_without_torch(bad, ranges)
    real = _loaded(bad)
    assert without_torch[str(bad)] == real
    assert [(i["key"], i["line"]) for i in real["issues"]] == [(k, n) for k, n, _ in BAD_PROBLEMS]
    real = _loaded(ranges)
    assert without_torch[str(ranges)] == real
    assert [(i["key"], i["line"]) for i in real["issues"]] == [
        ("methods[0].params.bits", line_of(ranges, "bits: 9")),
        ("methods[1].matrix.bits[1]", line_of(ranges, "bits: [2, 3]")),
        ("methods[2].params.residual", line_of(ranges, "residual: 40")),
        ("benchmarks[0].params.n_vectors", line_of(ranges, "n_vectors: 0")),
        ("benchmarks[1].params.context", line_of(ranges, "context: 100000")),
    ]


def test_without_torch_validate_refuses_a_method_parameter_out_of_its_range(tmp_path):
    suite = tmp_path / "bits9.yaml"
    suite.write_text("kvbench: 1\nmethods:\n  - name: intq\n    params: {bits: 9}\n"
                     "benchmarks:\n  - kind: proofs\n")
    done, imported = _kvbench(tmp_path, "validate", suite)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "invalid suite (1 problem(s)):",
        f"  {suite}:4: methods[0].params.bits: bits must be 2, 4 or 8, got 9",
    ]
    assert not set(HIDDEN) & set(imported)
    with_torch = invoke("validate", suite)  # the same refusal, word for word
    assert (with_torch.exit_code, with_torch.stderr) == (2, done.stderr)


_KINDS = HIDE + textwrap.dedent("""
    from kvbench.models.info import describe_model
    from kvbench.models.tiny_configs import TINY_KINDS

    print(json.dumps({kind: [k.describe() for k in describe_model(f"tiny:{kind}").layer_kinds]
                      for kind in TINY_KINDS}))
""")


def test_without_transformers_every_familys_layers_read_as_transformers_reads_them():
    """From the config's own keys (layer_types, Jamba's period, Zamba 2's block types,
    Nemotron-H's pattern, Llama 4's chunks, the model types whose layers follow from the type):
    what transformers' config classes say, so validation refuses the same cases."""
    from kvbench.models.info import describe_model
    from kvbench.models.tiny_configs import TINY_KINDS

    done = subprocess.run([sys.executable, "-c", _KINDS], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        kind: [k.describe() for k in describe_model(f"tiny:{kind}").layer_kinds]
        for kind in TINY_KINDS}
