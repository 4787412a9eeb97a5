"""Suite loading: expansion into cases, and every class of bad input named by file, line and key.

Most tests use a method and benchmarks registered here (names start with "_test") so that they do
not move when the shipped methods and benchmarks change; the last ones use the real ones.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from kvbench.benchmarks.specs.base import BENCHMARKS, Benchmark, MetricSpec
from kvbench.config.fields import SettingError, one_of, param
from kvbench.methods.settings.base import METHODS, MethodSettings
from kvbench.suite.errors import SuiteError, SuiteIssue
from kvbench.suite.loader import load_suite
from kvbench.suite.schema import SCHEMA_FILE, schema_text, suite_json_schema
from tests.plugins.extras import needs
from tests.plugins.suites import line_of

SUITES = Path(__file__).parent / "suites"


@dataclass
class _TestCodec(MethodSettings):
    # a declared range: refused as "bits must be 2, 4 or 8, got 0", blamed on bits
    bits: int = param(4, range=one_of(2, 4, 8), meaning="bits per code")
    group_size: int = 32
    mode: Literal["fast", "exact"] = "fast"


@dataclass
class _BenchParams:
    data: str = "gaussian"
    n: int = 16
    context: int = 128


class _TestBench(Benchmark):
    Params = _BenchParams
    metrics = {"cosine": MetricSpec("", "higher"), "mse": MetricSpec("", "lower")}

    def run(self, params, method, ctx):
        raise NotImplementedError


class _TestLM(Benchmark):
    Params = _BenchParams
    metrics = {"perplexity": MetricSpec("ppl", "lower")}
    uses_model = True

    def check(self, params, model):
        if model.max_context is not None and params.context > model.max_context:
            raise SettingError("context", f"context {params.context} is above the model's"
                                          f" {model.max_context}")

    def run(self, params, method, ctx):
        raise NotImplementedError


@pytest.fixture(autouse=True, scope="module")
def _registered():
    """The test-only method and benchmarks exist for this module only: registries are global."""
    added = [(METHODS, "_test_codec", _TestCodec), (BENCHMARKS, "_test_bench", _TestBench),
             (BENCHMARKS, "_test_lm", _TestLM)]
    for registry, name, cls in added:
        registry.register(name)(cls)
    yield
    for registry, name, _ in added:
        del registry._classes[name]


def _load(name: str):
    return load_suite(str(SUITES / name))


def _issues(name: str) -> list[SuiteIssue]:
    with pytest.raises(SuiteError) as caught:
        _load(name)
    assert str(caught.value) == "\n".join(map(str, caught.value.issues))
    return caught.value.issues


def _issue(issues: list[SuiteIssue], key: str, name: str = "") -> SuiteIssue:
    found = [i for i in issues if i.key == key and i.file.endswith(name)]
    assert len(found) == 1, f"{key!r} in {[str(i) for i in issues]}"
    return found[0]


def _assert_issue(issues, name, key, line_text, message, hint="", nth=1):
    issue = _issue(issues, key, name)
    assert issue.file == str(SUITES / name)
    assert issue.line == line_of(SUITES / name, line_text, nth), str(issue)
    assert message in issue.message, str(issue)
    assert hint in issue.hint, str(issue)


# ---- a valid suite ----------------------------------------------------------------------------

def test_valid_suite_expands_methods_matrix_and_selectors():
    suite = _load("valid.yaml")
    ids = [c.id for c in suite.cases]
    labels = ["identity", "_test_codec-bits8", "_test_codec-bits4", "_test_codec-bits2", "exact"]
    assert ids == (
        [f"_test_bench/{label}/data=gaussian" for label in labels]
        + [f"_test_bench/{label}/data=outliers" for label in labels]
        + ["_test_lm/identity", "_test_lm/_test_codec-bits8", "_test_lm/_test_codec-bits4"]
    )
    assert suite.name == "valid-suite"


def test_valid_suite_fills_params_and_defaults():
    cases = {c.id: c for c in _load("valid.yaml").cases}
    case = cases["_test_bench/_test_codec-bits2/data=outliers"]
    assert case.bench_params == {"data": "outliers", "n": 16, "context": 128}
    assert case.method == "_test_codec"
    assert case.method_params == {"bits": 2, "group_size": 16, "mode": "fast",
                                  "prefill_reads": "exact"}
    # device and repeats from the include, seed and model from the including file
    assert (case.device, case.seed, case.repeats, case.model) == ("cpu", 7, 2, "tiny:llama")
    assert case.timeout_s is None  # no limit unless the suite sets one
    lm = cases["_test_lm/identity"]
    assert (lm.repeats, lm.timeout_s, lm.bench_params["context"]) == (1, 30, 64)
    assert cases["_test_bench/exact/data=gaussian"].method_params["mode"] == "exact"


def test_claims_reach_the_cases_they_name():
    cases = {c.id: c for c in _load("valid.yaml").cases}
    texts = {i: [c.text for c in case.claims] for i, case in cases.items()}
    assert texts["_test_bench/identity/data=gaussian"] == ["mse >= 0"]
    assert texts["_test_bench/_test_codec-bits2/data=outliers"] == [
        "cosine >= 0.5", "mse >= 0", "mse <= 0.1"]
    # the method's cosine claim skips a benchmark that does not report cosine
    assert texts["_test_lm/_test_codec-bits4"] == []
    claim = cases["_test_bench/_test_codec-bits2/data=outliers"].claims[2]
    assert claim.source == f"{SUITES / 'valid.yaml'}:{line_of(SUITES / 'valid.yaml', 'mse <= 0.1')}"


def test_gate_merges_includes_and_hash_is_stable():
    suite = _load("valid.yaml")
    assert suite.default_tolerance.abs == 0.01  # from common.yaml
    assert suite.tolerance_for("cosine").rel == 0.01  # valid.yaml wins, written 1e-2
    assert suite.tolerance_for("mse").abs == 0.001
    assert suite.resolved["defaults"]["seed"] == 7
    names = [m["name"] for m in suite.resolved["methods"]]
    assert names == ["identity", "_test_codec", "_test_codec"]
    assert "include" not in suite.resolved
    assert suite.hash == _load("valid.yaml").hash and len(suite.hash) == 64


def test_hash_changes_with_the_suite(tmp_path):
    for name in ("valid.yaml", "common.yaml"):
        (tmp_path / name).write_text((SUITES / name).read_text())
    before = load_suite(tmp_path / "valid.yaml").hash
    common = tmp_path / "common.yaml"
    common.write_text(common.read_text().replace("repeats: 2", "repeats: 3"))
    assert load_suite(tmp_path / "valid.yaml").hash != before


def test_default_tolerance_and_name_when_absent():
    suite = _load("local_model.yaml")
    assert suite.name == "local_model"
    assert (suite.default_tolerance.abs, suite.default_tolerance.rel) == (None, 0.05)


def test_relative_checkpoint_path_resolves_against_the_suite_folder():
    case = _load("local_model.yaml").cases[0]
    assert case.model == str((SUITES / "ckpt").resolve())


def test_keyword_overrides_replace_defaults():
    suite = load_suite(SUITES / "valid.yaml", device="cuda", seed=3)
    assert {(c.device, c.seed) for c in suite.cases} == {("cuda", 3)}


# ---- bad input, shape ---------------------------------------------------------------------------

def test_yaml_syntax_error_names_the_parser_line():
    (issue,) = _issues("bad_syntax.yaml")
    assert issue.file == str(SUITES / "bad_syntax.yaml")
    assert issue.line == line_of(SUITES / "bad_syntax.yaml", "benchmarks:")  # where the parser stopped
    assert "YAML syntax error" in issue.message


def test_duplicate_yaml_key_is_refused():
    (issue,) = _issues("bad_duplicate_key.yaml")
    assert issue.key == "methods[0].params"
    assert issue.line == line_of(SUITES / "bad_duplicate_key.yaml", "params", 2)
    assert f"first written at line {line_of(SUITES / 'bad_duplicate_key.yaml', 'params')}" in issue.message


def test_other_schema_version_is_refused_naming_the_supported_one():
    issues = _issues("bad_version.yaml")
    _assert_issue(issues, "bad_version.yaml", "kvbench", "kvbench: 2",
                  "schema version 2 is not supported", "kvbench: 1")


def test_shape_errors_are_all_reported_with_line_and_key():
    issues = _issues("bad_schema.yaml")
    name = "bad_schema.yaml"
    _assert_issue(issues, name, "defaults.device", "device: gpu",
                  "'gpu' is not one of auto, cpu, cuda, cuda:N")
    _assert_issue(issues, name, "defaults.repeats", "repeats: 0", "greater than or equal to 1")
    _assert_issue(issues, name, "defaults.timeout_s", "timeout_s: 0", "greater than 0")
    _assert_issue(issues, name, "gate.default.rel", "rel: -0.1", "greater than or equal to 0")
    _assert_issue(issues, name, "gate.metrics.mse", "mse: {}", "give abs and/or rel")
    _assert_issue(issues, name, "methods[0].parmas", "parmas:", "unknown key 'parmas'",
                  "Did you mean 'params'")
    _assert_issue(issues, name, "methods[1].name", "label: nameless", "missing required key 'name'")
    _assert_issue(issues, name, "benchmarks[0].seed", 'seed: "3"', "valid integer, got text '3'")
    _assert_issue(issues, name, "benchmarks[0].methods", "methods: identity", "valid list")
    _assert_issue(issues, name, "benchmarks[1].claims[0].note", "note: why", "unknown key 'note'",
                  "allowed: cases, claim")
    assert len(issues) == 10


def test_empty_file_is_refused():
    (issue,) = _issues("empty.yaml")
    assert (issue.line, issue.message) == (1, "the file is empty")
    assert issue.hint == "a suite starts with `kvbench: 1`"


def test_suite_without_methods_is_refused():
    issues = _issues("empty_methods.yaml")
    assert [(i.key, i.line) for i in issues] == [("methods", 1)]


# ---- bad input, meaning -----------------------------------------------------------------------

def test_names_parameters_claims_and_selectors():
    issues = _issues("bad_names.yaml")
    name = "bad_names.yaml"
    _assert_issue(issues, name, "methods[0].name", "_test_codex", "unknown method '_test_codex'",
                  "Did you mean '_test_codec'?")
    _assert_issue(issues, name, "methods[1].params.bitz", "bitz: 4",
                  "unknown parameter 'bitz' of method '_test_codec'", "Did you mean 'bits'?")
    _assert_issue(issues, name, "methods[2].params.group_size", "group_size: many",
                  "must be a valid integer")
    _assert_issue(issues, name, "methods[3].matrix.bits[1]", "bits: [4, 0]",
                  "bits must be 2, 4 or 8, got 0")
    _assert_issue(issues, name, "methods[4].params.bits", "bits: 3",
                  "bits must be 2, 4 or 8, got 3")
    _assert_issue(issues, name, "benchmarks[0].kind", "_test_bnech",
                  "unknown benchmark '_test_bnech'", "Did you mean '_test_bench'")
    _assert_issue(issues, name, "benchmarks[1].params.dat", "dat: x",
                  "unknown parameter 'dat' of benchmark '_test_bench'", "Did you mean 'data'?")
    _assert_issue(issues, name, "benchmarks[1].methods[1]", '"zero-*", nope',
                  "'nope' matches no method label")
    _assert_issue(issues, name, "benchmarks[1].claims[0]", "cosine >= high", "is not a number")
    _assert_issue(issues, name, "benchmarks[1].claims[1]", "cosin >= 0.9",
                  "benchmark '_test_bench' does not report metric 'cosin'",
                  "Did you mean 'cosine'?")
    _assert_issue(issues, name, "benchmarks[1].claims[2].cases", "*bits9*",
                  "'*bits9*' matches no case of this benchmark")
    assert len(issues) == 11


def test_metric_names_in_gate_and_method_claims():
    issues = _issues("bad_metrics.yaml")
    name = "bad_metrics.yaml"
    _assert_issue(issues, name, "gate.metrics.cosin", "cosin:",
                  "no benchmark of this suite reports metric 'cosin'", "Did you mean 'cosine'?")
    _assert_issue(issues, name, "methods[0].claims[0]", "perplexity <= 2",
                  "the benchmarks running this method do not report metric 'perplexity'",
                  "known: cosine, mse")
    assert len(issues) == 2


def test_models_missing_unknown_or_too_short():
    issues = _issues("bad_models.yaml")
    name = "bad_models.yaml"
    _assert_issue(issues, name, "benchmarks[0].kind", "kind: _test_lm",
                  "benchmark '_test_lm' needs a model", "defaults.model")
    _assert_issue(issues, name, "benchmarks[1].model", "./no/such/checkpoint", "does not exist")
    _assert_issue(issues, name, "benchmarks[2].model", "bundled:nosuchmodel", "nosuchmodel")
    _assert_issue(issues, name, "benchmarks[3].params.context", "context: 100000",
                  "context 100000 is above the model's 4096")
    assert len(issues) == 4


def test_missing_include_and_include_cycle():
    issues = _issues("bad_include.yaml")
    _assert_issue(issues, "bad_include.yaml", "include[0]", "missing.yaml", "no such file")
    cycle = _issue(issues, "include[0]", "cycle_b.yaml")
    assert cycle.line == line_of(SUITES / "cycle_b.yaml", "include:")
    assert cycle.message.endswith("cycle_a.yaml -> " + str(SUITES / "cycle_b.yaml") + " -> "
                                  + str(SUITES / "cycle_a.yaml"))
    assert len(issues) == 2


def test_duplicate_labels_and_case_ids_name_both_places():
    issues = _issues("bad_duplicates.yaml")
    name = "bad_duplicates.yaml"
    label = _issue(issues, "methods[1]")
    assert label.line == line_of(SUITES / name, "- name: _test_codec", 2)
    assert f"methods[0] ({SUITES / name}:{line_of(SUITES / name, '- name: _test_codec')})" in label.message
    dup = _issue(issues, "benchmarks[1]")
    assert dup.line == line_of(SUITES / name, "- kind: _test_bench", 2)
    assert "case id '_test_bench/_test_codec-bits4' is also produced by benchmarks[0]" in (
        dup.message)


def test_missing_suite_file():
    with pytest.raises(SuiteError, match="no such suite file"):
        load_suite(SUITES / "nope.yaml")


# ---- the JSON schema --------------------------------------------------------------------------

def test_committed_json_schema_is_up_to_date():
    # After changing kvbench/suite/schema.py: python -m kvbench.suite.schema
    assert SCHEMA_FILE.read_text() == schema_text()


def test_json_schema_names_the_version_and_forbids_unknown_keys():
    schema = suite_json_schema()
    assert schema["properties"]["kvbench"]["const"] == 1
    assert schema["additionalProperties"] is False
    assert json.loads(SCHEMA_FILE.read_text())["required"] == ["kvbench"]


# ---- the shipped methods and benchmarks ---------------------------------------------------------

_SHIPPED = ("kvbench.methods.settings.intq", "kvbench.benchmarks.specs.proofs",
            "kvbench.benchmarks.specs.perplexity")
_real = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in _SHIPPED),
    reason="intq, proofs or perplexity not there yet",
)


@_real
def test_real_methods_and_benchmarks_expand():
    suite = _load("real.yaml")
    ids = [c.id for c in suite.cases]
    assert len(ids) == 2 * 4 + 2
    assert "proofs/intq-bits2/data=outliers" in ids and ids[-1] == "perplexity/intq-bits4"
    case = next(c for c in suite.cases if c.id == "proofs/intq-bits4/data=gaussian")
    assert case.method_params["bits"] == 4 and case.method_params["group_size"] == 32
    assert case.bench_params["n_vectors"] == 64 and case.bench_params["dim"] == 32


@_real
def test_real_impossible_settings_are_refused():
    issues = _issues("real_bad.yaml")
    bits = _issue(issues, "methods[0].params.bits")
    assert bits.line == line_of(SUITES / "real_bad.yaml", "bits: 3") and "3" in bits.message
    context = _issue(issues, "benchmarks[0].params.context")
    assert context.line == line_of(SUITES / "real_bad.yaml", "context: 8000")


@_real
def test_text_files_resolve_against_the_suite_folder_and_missing_ones_are_refused():
    issues = _issues("real_text.yaml")
    missing = _issue(issues, "benchmarks[1].params.text")
    assert missing.line == line_of(SUITES / "real_text.yaml", "texts/missing.txt")
    assert "missing.txt" in missing.message and "does not exist" in missing.message
    assert not [i for i in issues if i.key.startswith("benchmarks[0]")]


def test_backend_mlx_refuses_methods_and_benchmarks_without_mlx_support():
    pytest.importorskip("mlx.core")
    issues = _issues("mlx_unsupported.yaml")
    by_key = {issue.key: issue for issue in issues}
    assert "no mlx implementation" in by_key["methods[1].name"].message
    assert by_key["methods[1].name"].line == line_of(SUITES / "mlx_unsupported.yaml", "kvb_testplugin:Nop")
    assert "does not run on backend 'mlx'" in by_key["benchmarks[0].kind"].message
    assert "methods[0].name" not in by_key  # identity has one


def test_backend_torch_refuses_methods_without_a_torch_implementation():
    issues = _issues("torch_unsupported.yaml")
    by_key = {issue.key: issue for issue in issues}
    refused = by_key["methods[1].name"]
    assert "method 'mlx-lm-quantized' has no torch implementation" in refused.message
    assert refused.line == line_of(SUITES / "torch_unsupported.yaml", "mlx-lm-quantized")
    assert "backend: mlx" in refused.hint and "methods[0].name" not in by_key


def test_backend_override_reaches_every_case():
    pytest.importorskip("mlx.core")
    cases = load_suite(SUITES.parent.parent / "suites" / "quick.yaml", backend="mlx").cases
    assert {c.backend for c in cases} == {"mlx"}
    assert {c.backend for c in load_suite(SUITES.parent.parent / "suites" / "quick.yaml").cases} == {"torch"}


# ---- hostile input: what the fuzzer (test_suite_fuzz.py) and probing found ---------------------

def _issues_of(tmp_path: Path, text: str) -> tuple[str, list[SuiteIssue]]:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    return str(path), caught.value.issues


def test_a_matrix_too_big_is_refused_unexpanded_at_its_line(tmp_path):
    keys = "\n".join(f"      k{i}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]" for i in range(10))
    path, issues = _issues_of(tmp_path, f"""kvbench: 1
methods:
  - name: _test_codec
    matrix:
{keys}
benchmarks:
  - kind: _test_bench
""")
    (issue,) = issues  # nothing else was looked at: not even the unknown parameters
    assert (issue.file, issue.line, issue.key) == (path, 4, "methods[0].matrix")
    assert "10000000000 method variants, more than the 10000" in issue.message


def test_cases_over_the_limit_are_refused_at_the_biggest_benchmark(tmp_path):
    path, issues = _issues_of(tmp_path, f"""kvbench: 1
methods:
  - name: _test_codec
    matrix: {{group_size: {list(range(1, 102))}}}
benchmarks:
  - kind: _test_bench
  - kind: _test_bench
    matrix: {{n: {list(range(100))}}}
""")
    (issue,) = issues
    assert (issue.line, issue.key) == (8, "benchmarks[1].matrix")
    assert "makes 10201 cases, more than the 10000" in issue.message
    assert "this entry makes 10100" in issue.hint


def test_parameters_must_have_the_type_yaml_wrote_not_a_coercible_one(tmp_path):
    _, issues = _issues_of(tmp_path, """kvbench: 1
methods:
  - name: _test_codec
    params: {bits: "4", group_size: true}
benchmarks:
  - kind: _test_bench
    matrix: {n: [16, 1.0]}
""")
    assert [(i.key, i.message) for i in issues] == [
        ("methods[0].params.bits", "must be a valid integer, got text '4'"),
        ("methods[0].params.group_size", "must be a valid integer, got a boolean True"),
        ("benchmarks[0].matrix.n[1]", "must be a valid integer, got float 1.0"),
    ]


def test_a_repeated_matrix_value_is_named_at_the_matrix(tmp_path):
    path, issues = _issues_of(tmp_path, """kvbench: 1
methods:
  - name: _test_codec
    matrix: {bits: [4, 4]}
benchmarks:
  - kind: _test_bench
""")
    assert [(i.line, i.key, i.message) for i in issues] == [
        (4, "methods[0].matrix", "method label '_test_codec-bits4' is made twice here"),
        (6, "benchmarks[0]", "case id '_test_bench/_test_codec-bits4' is produced twice here")]


@pytest.mark.parametrize("name, words", [
    (":", "cannot import method ':': ValueError"),
    ("os:sep", "method 'os:sep' is not a class"),
    pytest.param("tests.plugins.kvb_testplugin:Step", "is not a method: it must be a dataclass",
                 marks=needs("torch")),  # the test plug-in's module imports torch
])
def test_a_module_class_path_that_is_no_method_is_an_issue(tmp_path, name, words):
    _, issues = _issues_of(tmp_path, f"""kvbench: 1
methods:
  - name: "{name}"
benchmarks:
  - kind: _test_bench
""")
    (issue,) = issues
    assert (issue.line, issue.key) == (3, "methods[0].name") and words in issue.message


@pytest.mark.parametrize("text, line, words", [
    ("kvbench: 1\nname: a\x07b\n", 2, "character '\\x07' is not allowed"),
    ("kvbench: 1\nmethods: [{name: identity}\n", 2, "YAML syntax error"),  # not 3: past the end
    ("kvbench: true\n", 1, "schema version True is not supported"),
    ("kvbench: 1\nx: " + "[" * 5000 + "]" * 5000 + "\n", 1, "nested too deeply"),
])
def test_broken_yaml_names_a_line_of_the_file(tmp_path, text, line, words):
    _, issues = _issues_of(tmp_path, text)
    assert issues[0].line == line and words in issues[0].message, issues[0]


def test_an_alias_bomb_is_refused_at_the_key_that_holds_it(tmp_path):
    lines = ['kvbench: 1', 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 8)}]" for i in range(1, 9)]
    _, issues = _issues_of(tmp_path, "\n".join(lines) + "\n")  # 8**9: 134 million strings
    (issue,) = issues
    assert (issue.line, issue.key) == (7, "a5")
    assert "more than 100000 keys and list items" in issue.message


def test_a_model_path_under_an_unknown_users_home_does_not_exist(tmp_path):
    _, issues = _issues_of(tmp_path, """kvbench: 1
defaults: {model: "~nosuchuser_kvbench/ckpt"}
methods: [{name: identity}]
benchmarks: [{kind: _test_lm}]
""")
    (issue,) = issues
    assert issue.key == "defaults.model" and "'~nosuchuser_kvbench/ckpt' does not exist" in (
        issue.message)


def test_every_bad_parameter_of_a_block_is_reported_at_once(tmp_path):
    """A block with a wrong YAML type and bad ranges beside it took a round per error: the
    ranges were checked only once the types passed, and stopped at the first."""
    path = tmp_path / "bad.yaml"
    path.write_text("""kvbench: 1
name: bad
defaults: {model: "tiny:llama"}
methods:
  - {name: intq, params: {bits: 99, group_size: -1, axis: diagonal}}
benchmarks:
  - kind: perplexity
    params: {context: -5, continuation: "x", windows: 0}
""")
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    found = sorted((issue.line, issue.key) for issue in caught.value.issues)
    assert found == [(5, "methods[0].params.axis"), (5, "methods[0].params.bits"),
                     (5, "methods[0].params.group_size"), (8, "benchmarks[0].params.context"),
                     (8, "benchmarks[0].params.continuation"),
                     (8, "benchmarks[0].params.windows")]



@pytest.mark.parametrize("name", [name for name in BENCHMARKS.names()
                                  if BENCHMARKS.get(name).uses_model])
def test_a_benchmark_that_runs_the_model_refuses_a_check_without_one(name, tmp_path):
    """A suite without a model is refused before check() runs; a direct call to check() (a
    plug-in's, a test's) gets the same sentence, not a crash on the missing model."""
    data = tmp_path / "samples.jsonl"
    data.write_text(json.dumps({"context": "c", "input": "q", "answers": ["a"]}) + "\n")
    # the parameters without a default, or whose default cannot be checked
    given = {"dataset": {"data": str(data)},
             "compaction": {"trajectory": "a passage", "task": "a question"}}.get(name, {})
    cls = BENCHMARKS.get(name)
    with pytest.raises(SettingError, match=f"^{name} needs a model; set the suite's model$"):
        cls().check(cls.Params(**given), None)
