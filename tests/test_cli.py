"""The command line, end to end through click: exit codes, what each command prints and writes.

Runs use small synthetic proofs suites and the test-only benchmarks of tests/plugins (named by
`module:Class` in tests/suites/cli/*.yaml); no model is loaded anywhere in this file.
"""
from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import kvbench
from kvbench import cli
from kvbench.results import SCHEMA_VERSION
from tests.plugins.cli_support import invoke, load_json, wide_consoles  # noqa: F401
from tests.plugins.kvb_testplugin import ABSENT_LIBRARY, CRASH_MESSAGE
from tests.plugins.suites import ROOT, line_of

SUITES = ROOT / "tests" / "suites" / "cli"
TINY = SUITES / "tiny.yaml"
TINY_IDS = [
    f"proofs/{label}/data={data}"
    for data in ("gaussian", "sphere") for label in ("identity", "intq-bits8", "intq-bits4")
]


def case_ids(output: str) -> list[str]:
    return re.findall(r"proofs/[\w.=-]+/data=\w+", output)


def cases_by_id(results: dict) -> dict[str, dict]:
    return {c["id"]: c for c in results["cases"]}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One run of tiny.yaml (6 proofs cases, every claim holds), shared read-only."""
    out = tmp_path_factory.mktemp("tiny") / "out"
    result = invoke("run", TINY, "--out", out)
    assert result.exit_code == 0, result.output
    return out, result.output


# ---------------------------------------------------------------- validate


def test_validate_good_suite_exits_0_and_counts_cases():
    result = invoke("validate", TINY)
    assert result.exit_code == 0, result.output
    assert "valid: cli-tiny: 6 case(s)" in result.output


@pytest.mark.parametrize("name, anchor, key, words", [
    ("bad_key.yaml", "parmas:", "benchmarks[0].parmas",
     ["unknown key 'parmas'", "Did you mean 'params'"]),
    ("bad_method.yaml", "name: intk", "methods[1].name",
     ["unknown method 'intk'", "Did you mean 'intq'"]),
    ("bad_bits.yaml", "bits: 0", "methods[0].params.bits", ["bits must be 2, 4 or 8, got 0"]),
    ("bad_model_path.yaml", "model: ./no/such", "benchmarks[0].model",
     ["no/such/checkpoint", "does not exist"]),
    # tiny:llama is good for 4096 tokens: 4096 + 64 is refused, 128 + 64 (same entry) is not.
    ("bad_context.yaml", "context: [128, 4096]", "benchmarks[0].matrix.context[1]",
     ["4096 + 64 = 4160", "above the 4096", "tiny:llama"]),
])
def test_validate_bad_suite_names_file_line_and_key(name, anchor, key, words):
    path = SUITES / name
    result = invoke("validate", path)
    assert result.exit_code == 2, result.output
    assert "1 problem(s)" in result.output
    assert f"{path}:{line_of(path, anchor)}: {key}: " in result.output
    for word in words:
        assert word in result.output
    assert "valid:" not in result.output


def test_tiny_llama_context_limit_is_what_the_context_suite_assumes():
    from kvbench.models import describe_model

    assert describe_model("tiny:llama").max_context == 4096


def test_validate_missing_file_exits_2():
    result = invoke("validate", SUITES / "no_such_suite.yaml")
    assert result.exit_code == 2
    assert "no such suite file" in result.output


# ---------------------------------------------------------------- run: selection


def test_dry_run_lists_expanded_case_ids_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = invoke("run", TINY, "--out", out, "--dry-run")
    assert result.exit_code == 0, result.output
    assert case_ids(result.output) == TINY_IDS
    assert "cli-tiny: 6 case(s)" in result.output
    assert "cosine >= 0.999" in result.output  # the claims column
    assert not out.exists() and not (tmp_path / "runs").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options, expected", [
    (["--only", "sphere"], [i for i in TINY_IDS if "sphere" in i]),
    (["--only", "proofs/intq-*/data=gaussian"],
     ["proofs/intq-bits8/data=gaussian", "proofs/intq-bits4/data=gaussian"]),
    (["--methods", "intq-bits8"], [i for i in TINY_IDS if "bits8" in i]),
    (["--methods", "intq"], [i for i in TINY_IDS if "intq" in i]),  # the method name
    (["--methods", "identity,intq-bits4"], [i for i in TINY_IDS if "bits8" not in i]),
    (["--methods", "intq-*"], [i for i in TINY_IDS if "intq" in i]),
    (["--limit", "2"], TINY_IDS[:2]),
    (["--methods", "intq*", "--only", "sphere", "--limit", "1"], ["proofs/intq-bits8/data=sphere"]),
])
def test_selection_options(options, expected):
    result = invoke("run", TINY, "--dry-run", *options)
    assert result.exit_code == 0, result.output
    assert case_ids(result.output) == expected
    assert f"{len(expected)} case(s)" in result.output


def test_unknown_method_label_exits_2_with_did_you_mean():
    result = invoke("run", TINY, "--dry-run", "--methods", "intq-bits3")
    assert result.exit_code == 2
    assert "--methods: 'intq-bits3' matches no method label or name" in result.output
    assert "Did you mean" in result.output and "'intq-bits8'" in result.output
    assert case_ids(result.output) == []


def test_only_matching_nothing_exits_2():
    result = invoke("run", TINY, "--dry-run", "--only", "no-such-case")
    assert result.exit_code == 2
    assert "matches no case" in result.output


def labelled_suite(tmp_path: Path) -> Path:
    """tiny.yaml with its intq entry labelled `q`: labels and method names differ."""
    path = tmp_path / "labelled.yaml"
    path.write_text(TINY.read_text().replace("  - name: intq\n", "  - name: intq\n    label: q\n")
                    .replace("intq-bits", "q-bits"))
    return path


@pytest.mark.parametrize("pattern, labels", [
    ("intq*", ["q-bits8", "q-bits4"]),  # the method's name, globbed: was 0 cases and exit 0
    ("intq", ["q-bits8", "q-bits4"]),
    ("q-bits4", ["q-bits4"]),
    ("q-*", ["q-bits8", "q-bits4"]),
    ("ident*", ["identity"]),
])
def test_methods_matches_labels_and_names_alike(tmp_path, pattern, labels):
    suite = labelled_suite(tmp_path)
    result = invoke("run", suite, "--dry-run", "--methods", pattern)
    assert result.exit_code == 0, result.output
    shown = re.findall(r"proofs/([\w.-]+)/data=gaussian", result.output)
    assert shown == labels


@pytest.mark.parametrize("options, message", [
    (["--methods", "kivi*"], "--methods: 'kivi*' matches no method label or name in"),
    (["--methods", "identity", "--only", "q-bits"],
     "--only 'q-bits' matches no case among the --methods selection. Case ids: "
     "proofs/identity/data=gaussian, proofs/identity/data=sphere"),
])
def test_a_selection_of_nothing_exits_2_with_what_there_is(tmp_path, options, message):
    result = invoke("run", labelled_suite(tmp_path), "--dry-run", *options)
    assert result.exit_code == 2
    assert message in result.output
    if "--only" not in options:
        assert "Available: identity, intq, q-bits4, q-bits8" in result.output


def test_limit_zero_is_refused():
    result = CliRunner().invoke(cli.main, ["run", str(TINY), "--dry-run", "--limit", "0"])
    assert result.exit_code == 2 and "--limit" in result.output


def test_resume_with_other_repeats_or_device_is_refused(tmp_path):
    out = tmp_path / "out"
    assert invoke("run", TINY, "--out", out, "--limit", "2", "--repeats", "2").exit_code == 0
    saved = (out / "results.jsonl").read_bytes()
    result = invoke("run", TINY, "--out", out, "--resume")
    assert result.exit_code == 2
    assert "was run with other settings (repeats 2 then, not set now)" in result.output
    # a run made on another device (as its header says) is not continued on this one
    jsonl = out / "results.jsonl"
    header, *cases = jsonl.read_text().splitlines(keepends=True)
    moved = json.loads(header)
    moved["header"]["settings"]["device"] = "cuda:0"
    jsonl.write_text(json.dumps(moved) + "\n" + "".join(cases))
    result = invoke("run", TINY, "--out", out, "--resume", "--repeats", "2")
    assert result.exit_code == 2
    assert "(device 'cuda:0' then, 'cpu' now)" in result.output
    jsonl.write_bytes(saved)
    result = invoke("run", TINY, "--out", out, "--resume", "--repeats", "2")
    assert result.exit_code == 0, result.output
    assert "resuming: 2 finished case(s) kept, 4 to run" in result.output


def test_resume_on_another_backend_is_refused_naming_it(tmp_path):
    pytest.importorskip("mlx.core")
    out = tmp_path / "out"
    assert invoke("run", TINY, "--out", out, "--limit", "1").exit_code == 0
    result = invoke("run", TINY, "--out", out, "--resume", "--backend", "mlx")
    assert result.exit_code == 2
    assert "(backend 'torch' then, 'mlx' now)" in result.output


def test_run_with_only_writes_just_those_cases(tmp_path):
    out = tmp_path / "out"
    result = invoke("run", TINY, "--out", out, "--only", "intq-bits4")
    assert result.exit_code == 0, result.output
    assert [c["id"] for c in load_json(out / "results.json")["cases"]] == [
        "proofs/intq-bits4/data=gaussian", "proofs/intq-bits4/data=sphere"]


# ---------------------------------------------------------------- run: outputs and exit codes


def test_run_writes_results_json_jsonl_and_report(tiny_run):
    out, output = tiny_run
    results = load_json(out / "results.json")
    assert results["schema_version"] == SCHEMA_VERSION
    assert results["suite"]["name"] == "cli-tiny"
    assert results["interrupted"] is False and results["finished"]
    assert [c["id"] for c in results["cases"]] == TINY_IDS
    assert all(c["status"] == "ok" for c in results["cases"])
    by_id = cases_by_id(results)
    identity = by_id["proofs/identity/data=gaussian"]
    assert identity["metrics"]["mse"]["value"] == 0
    assert identity["metrics"]["compression_ratio"]["value"] == 1
    assert [cl["verdict"] for cl in identity["claims"]] == ["held", "held"]
    # fewer bits, more error; and intq really compresses
    bits8, bits4 = by_id["proofs/intq-bits8/data=gaussian"], by_id["proofs/intq-bits4/data=gaussian"]
    assert 0 < bits8["metrics"]["mse"]["value"] < bits4["metrics"]["mse"]["value"]
    assert bits4["metrics"]["compression_ratio"]["value"] > 2
    assert bits4["method_params"]["bits"] == 4 and bits4["bench_params"]["n_vectors"] == 256

    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [line["type"] for line in lines] == ["header"] + ["case"] * 6
    assert lines[0]["header"]["suite"]["hash"] == results["suite"]["hash"]
    assert [line["case"]["id"] for line in lines[1:]] == TINY_IDS

    report = (out / "report.md").read_text()
    assert report.startswith("# kvbench: cli-tiny")
    assert "## proofs" in report and "## Claims" in report
    assert all(case_id in report for case_id in TINY_IDS)
    assert "claims held 8/8" in output and "errors 0" in output


def test_run_exits_1_when_a_claim_fails(tmp_path):
    out = tmp_path / "out"
    result = invoke("run", SUITES / "tiny_fail.yaml", "--out", out)
    assert result.exit_code == 1, result.output
    by_id = cases_by_id(load_json(out / "results.json"))
    assert {c["status"] for c in by_id.values()} == {"ok"}
    assert [cl["verdict"] for cl in by_id["proofs/identity"]["claims"]] == ["held"]
    failed = by_id["proofs/intq"]["claims"]
    assert [(cl["claim"], cl["verdict"]) for cl in failed] == [("mse == 0", "failed")]
    assert failed[0]["measured"] > 0
    assert "FAILED" in result.output and "claims held 1/2, failed 1" in result.output
    assert (out / "report.md").exists()


def test_run_exits_3_when_a_case_crashes_and_runs_the_others(tmp_path):
    out = tmp_path / "out"
    result = invoke("run", SUITES / "crash.yaml", "--out", out)
    assert result.exit_code == 3, result.output
    results = load_json(out / "results.json")
    crash_id = "tests.plugins.kvb_testplugin:Crash/identity"
    step_id = "tests.plugins.kvb_testplugin:Step/identity"
    assert [(c["id"], c["status"]) for c in results["cases"]] == [
        ("proofs/identity", "ok"), (crash_id, "error"), (step_id, "ok")]
    crash, step = results["cases"][1], results["cases"][2]
    assert crash["error"]["type"] == "ValueError"
    assert CRASH_MESSAGE in crash["error"]["message"]
    trace = crash["error"]["traceback"]
    assert trace.startswith("Traceback") and "_explode" in trace and "kvb_testplugin.py" in trace
    assert crash["metrics"] == {}
    assert step["metrics"]["value"]["value"] == 7  # the case after the crash ran
    assert [cl["verdict"] for cl in step["claims"]] == ["held"]
    assert "errors 1" in result.output and CRASH_MESSAGE in result.output
    jsonl = (out / "results.jsonl").read_text().splitlines()
    assert len(jsonl) == 4


def test_cases_whose_library_is_missing_are_refused_and_the_others_run(tmp_path):
    result = invoke("validate", SUITES / "refused.yaml")
    assert result.exit_code == 0, result.output
    assert "3 case(s) refused" in result.output and ABSENT_LIBRARY in result.output
    out = tmp_path / "out"
    result = invoke("run", SUITES / "refused.yaml", "--out", out)
    assert result.exit_code == 0, result.output
    cases = load_json(out / "results.json")["cases"]
    step = "tests.plugins.kvb_testplugin:Step"
    assert [(c["id"], c["status"]) for c in cases] == [
        (f"{step}/identity", "ok"), (f"{step}/Unbuildable-knob1", "refused"),
        (f"{step}/Unbuildable-knob2", "refused"),
        ("tests.plugins.kvb_testplugin:Unreachable/identity", "refused")]
    assert cases[1]["error"]["message"] == ABSENT_LIBRARY and cases[1]["metrics"] == {}
    assert cases[1]["claims"] == [] and cases[0]["claims"][0]["verdict"] == "held"
    assert "refused 3" in result.output
    report = (out / "report.md").read_text()
    assert "1 ok, 3 refused" in report and ABSENT_LIBRARY in report
    assert "3 case(s) refused" in result.output
    # a run lists the refused cases it chose, not those its filters left out
    chosen = invoke("run", SUITES / "refused.yaml", "--methods", "identity", "--dry-run")
    assert "1 case(s) refused" in chosen.output and "Unbuildable-knob1" not in chosen.output


def test_missing_baseline_exits_4_and_runs_nothing(tmp_path):
    out = tmp_path / "out"
    result = invoke("run", TINY, "--out", out, "--baseline", tmp_path / "nope.json")
    assert result.exit_code == 4, result.output
    assert "nope.json does not exist" in result.output
    assert not out.exists()


def test_baseline_from_another_suite_exits_4(tiny_run, tmp_path):
    out, _ = tiny_run
    other = tmp_path / "base.json"
    data = load_json(out / "results.json")
    data["suite"]["name"] = "some-other-suite"
    other.write_text(json.dumps(data))
    result = invoke("run", TINY, "--out", tmp_path / "out", "--baseline", other)
    assert result.exit_code == 4
    assert "not comparable" in result.output and "some-other-suite" in result.output
    assert not (tmp_path / "out").exists()


def test_baseline_with_better_metric_exits_1(tiny_run, tmp_path):
    out, _ = tiny_run
    data = load_json(out / "results.json")
    case = cases_by_id(data)["proofs/intq-bits4/data=gaussian"]
    case["metrics"]["mse"]["value"] /= 100  # the baseline was 100x better
    baseline = tmp_path / "better.json"
    baseline.write_text(json.dumps(data))
    run_out = tmp_path / "out"
    result = invoke("run", TINY, "--out", run_out, "--baseline", baseline)
    assert result.exit_code == 1, result.output
    assert "regressions 1" in result.output
    assert re.search(r"regression proofs/intq-bits4/data=gaussian mse", result.output)
    report = (run_out / "report.md").read_text()
    assert "## Gate against the baseline" in report and "**regression** (exit 1)" in report


def test_baseline_save_then_run_against_it_exits_0(tiny_run, tmp_path):
    out, _ = tiny_run
    saved = tmp_path / "baselines" / "tiny.json"
    result = invoke("baseline", "save", out / "results.json", "--to", saved)
    assert result.exit_code == 0, result.output
    assert load_json(saved) == load_json(out / "results.json")
    run_out = tmp_path / "out"
    result = invoke("run", TINY, "--out", run_out, "--baseline", saved)
    assert result.exit_code == 0, result.output
    assert "regressions 0" in result.output
    assert "no regression (exit 0)" in (run_out / "report.md").read_text()


Q_SUITE = """\
kvbench: 1
name: q
defaults: {device: cpu, repeats: 1}
methods:
  - name: intq
    label: q
    params: {group_size: 32, bits: BITS}
benchmarks:
  - kind: proofs
    params: {n_vectors: 256, dim: 32, n_queries: 8}
    matrix: {data: [gaussian, sphere]}
"""


def gate_findings(output: str) -> list[str]:
    """What a gate found, as run's summary and compare --gate both print it."""
    return sorted(line.strip() for line in output.splitlines()
                  if re.match(r"\s+(gate|regression|claim \w+|error|timeout): ", line))


def test_a_changed_setting_is_marked_not_comparable_and_the_rest_are_gated(tmp_path):
    """Baseline: intq bits 4 under label q; then the suite says bits 8. Never a regression: the
    q cases run and are marked not comparable, identity's are still gated, and the command that
    makes this run q's baseline is printed; --strict refuses before anything runs."""
    suite = tmp_path / "q.yaml"
    with_identity = Q_SUITE.replace("methods:\n", "methods:\n  - name: identity\n")
    suite.write_text(with_identity.replace("BITS", "4"))
    first = tmp_path / "first"
    assert invoke("run", suite, "--out", first).exit_code == 0
    baseline = tmp_path / "q-bits4.json"
    assert invoke("baseline", "save", first / "results.json", "--to", baseline).exit_code == 0
    suite.write_text(with_identity.replace("BITS", "8"))
    strict = invoke("run", suite, "--out", tmp_path / "strict", "--baseline", baseline,
                    "--strict")
    assert strict.exit_code == 4
    assert "2 case(s) are defined otherwise there" in strict.output
    assert "proofs/q/data=gaussian: method_params.bits: 4 -> 8" in strict.output
    assert not (tmp_path / "strict").exists()

    second = tmp_path / "second"
    result = invoke("run", suite, "--out", second, "--baseline", baseline)
    assert result.exit_code == 0, result.output
    assert "not comparable 2" in result.output and "regressions 0" in result.output
    refresh = (f"kvbench baseline save {second / 'results.json'} --to {baseline} --cases "
               "proofs/q/data=gaussian,proofs/q/data=sphere")
    assert refresh in result.output
    report = (second / "report.md").read_text()
    assert "### Not comparable cases (defined otherwise: not gated)" in report
    rows = load_json(second / "results.json")
    gated = gate_report_of(rows, baseline)
    identity = {r.verdict for r in gated.rows if r.case_id.startswith("proofs/identity")}
    assert "same" in identity and "not comparable" not in identity  # judged, not set aside
    # compare --gate on the same files: the same exit and the same findings
    compared = invoke("compare", baseline, second / "results.json", "--gate")
    assert compared.exit_code == 0 and gate_findings(compared.output) == gate_findings(
        result.output) != []
    assert invoke("compare", baseline, second / "results.json", "--gate",
                  "--strict").exit_code == 4

    # the printed command: q's cases from this run, identity's kept from the first
    before = load_json(baseline)
    saved = invoke(*refresh.split()[1:])
    assert saved.exit_code == 0, saved.output
    after = cases_by_id(load_json(baseline))
    assert after["proofs/q/data=gaussian"]["method_params"]["bits"] == 8
    assert after["proofs/identity/data=gaussian"] == cases_by_id(before)[
        "proofs/identity/data=gaussian"]
    again = invoke("run", suite, "--out", tmp_path / "third", "--baseline", baseline)
    assert again.exit_code == 0 and "not comparable" not in again.output


def gate_report_of(results: dict, baseline_path):
    from kvbench.judge.gate import gate
    from kvbench.results import RunResult, load_results

    return gate(RunResult.model_validate(results), load_results(baseline_path))


SUBSET_SUITE = """\
kvbench: 1
name: subset
defaults: {device: cpu, repeats: 1}
methods:
  - name: identity
  - name: tests.plugins.kvb_testplugin:Nop
benchmarks:
  - kind: proofs
    methods: [identity]
    params: {n_vectors: 64, dim: 32, n_queries: 4}
    claims:
      - {cases: "proofs/identity", claim: "mse == 0"}
  - kind: tests.plugins.kvb_testplugin:Step
    methods: ["*Nop"]
    params: {sleep_s: 0.0}
"""


def test_a_subset_run_and_compare_gate_of_its_file_agree(tmp_path):
    """A baseline of the whole suite (with a plug-in); a run of a subset that loads no plug-in:
    run --baseline and compare --gate give the same exit code and the same findings."""
    suite = tmp_path / "subset.yaml"
    suite.write_text(SUBSET_SUITE)
    full = tmp_path / "full"
    assert invoke("run", suite, "--out", full).exit_code == 0
    baseline = tmp_path / "base.json"
    assert invoke("baseline", "save", full / "results.json", "--to", baseline).exit_code == 0
    assert load_json(baseline)["plugins"]
    part = tmp_path / "part"
    result = invoke("run", suite, "--out", part, "--only", "proofs/*", "--baseline", baseline)
    assert result.exit_code == 0, result.output
    stored = load_json(part / "results.json")
    assert stored["plugins"] == {} and stored["selection"] == {"only": "proofs/*"}
    assert "in the baseline, not in this run" not in result.output
    compared = invoke("compare", baseline, part / "results.json", "--gate")
    assert compared.exit_code == result.exit_code
    assert gate_findings(compared.output) == gate_findings(result.output)
    assert "plug-in" not in compared.output
    # the whole suite's run lacking a case is still a lost case, for both
    data = load_json(full / "results.json")
    data["cases"] = data["cases"][:-1]
    short = tmp_path / "short.json"
    short.write_text(json.dumps(data))
    lost = invoke("compare", baseline, short, "--gate")
    assert lost.exit_code == 1 and "in the baseline, not in this run" in lost.output


def test_baseline_save_refuses_error_cases_unless_allowed(tmp_path):
    out = tmp_path / "out"
    assert invoke("run", SUITES / "crash.yaml", "--out", out).exit_code == 3
    to = tmp_path / "base.json"
    result = invoke("baseline", "save", out / "results.json", "--to", to)
    assert result.exit_code == 2
    assert "did not finish ok" in result.output and "--allow-errors" in result.output
    assert "tests.plugins.kvb_testplugin:Crash/identity" in result.output
    assert not to.exists()
    result = invoke("baseline", "save", out / "results.json", "--to", to, "--allow-errors")
    assert result.exit_code == 0, result.output
    assert load_json(to)["cases"][1]["status"] == "error"


def test_baseline_save_refuses_an_interrupted_run(tiny_run, tmp_path):
    out, _ = tiny_run
    data = load_json(out / "results.json")
    data["interrupted"] = True
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    result = invoke("baseline", "save", path, "--to", tmp_path / "base.json")
    assert result.exit_code == 2 and "interrupted" in result.output
    assert not (tmp_path / "base.json").exists()


# ---------------------------------------------------------------- report, compare


def test_report_md_prints_the_tables(tiny_run):
    out, _ = tiny_run
    result = invoke("report", out / "results.json", "--format", "md")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# kvbench: cli-tiny")
    assert "## proofs" in result.output and "## Claims" in result.output
    assert "| proofs/intq-bits4/data=sphere |" in result.output
    # the same report the run wrote
    assert result.output.strip() == (out / "report.md").read_text().strip()


def test_report_json_equals_the_file(tiny_run):
    out, _ = tiny_run
    result = invoke("report", out / "results.json", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == load_json(out / "results.json")


def test_report_from_jsonl_is_marked_interrupted(tiny_run):
    out, _ = tiny_run
    result = invoke("report", out / "results.jsonl", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["interrupted"] is True and [c["id"] for c in data["cases"]] == TINY_IDS


def test_report_missing_file_exits_2(tmp_path):
    result = invoke("report", tmp_path / "missing.json")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_report_readme_injects_between_markers(tiny_run, tmp_path):
    out, _ = tiny_run
    readme = tmp_path / "README.md"
    start, end = "<!-- kvbench:start results -->", "<!-- kvbench:end results -->"
    readme.write_text(f"# Project\n\nbefore\n\n{start}\nold table\n{end}\n\nafter\n")
    result = invoke("report", out / "results.json", "--readme", readme, "--section", "results")
    assert result.exit_code == 0, result.output
    text = readme.read_text()
    assert text.startswith(f"# Project\n\nbefore\n\n{start}\n")
    assert text.endswith(f"\n{end}\n\nafter\n")
    inside = text.split(start)[1].split(end)[0]
    assert "old table" not in inside
    assert "### proofs" in inside and "| method | data | compression_ratio" in inside
    assert "| intq-bits8 | gaussian |" in inside and "| identity | sphere |" in inside
    # again: same text (idempotent)
    assert invoke("report", out / "results.json", "--readme", readme,
                  "--section", "results").exit_code == 0
    assert readme.read_text() == text


def test_report_readme_without_markers_exits_2_and_leaves_it(tiny_run, tmp_path):
    out, _ = tiny_run
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n\nno markers here\n")
    result = invoke("report", out / "results.json", "--readme", readme, "--section", "results")
    assert result.exit_code == 2
    assert "<!-- kvbench:start results -->" in result.output
    assert readme.read_text() == "# Project\n\nno markers here\n"


def test_report_readme_needs_section(tiny_run, tmp_path):
    out, _ = tiny_run
    result = invoke("report", out / "results.json", "--readme", tmp_path / "README.md")
    assert result.exit_code == 2 and "--section" in result.output


def test_compare_prints_ratios_and_marks(tiny_run, tmp_path):
    out, _ = tiny_run
    data = load_json(out / "results.json")
    by_id = cases_by_id(data)
    by_id["proofs/intq-bits4/data=gaussian"]["metrics"]["mse"]["value"] *= 10  # B worse
    by_id["proofs/intq-bits8/data=sphere"]["metrics"]["mse"]["value"] /= 4  # B better
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    result = invoke("compare", out / "results.json", b)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "| mark | case | metric | A | B | B/A | rule |" in lines
    worse = [ln for ln in lines if "proofs/intq-bits4/data=gaussian" in ln and "| mse" in ln]
    better = [ln for ln in lines if "proofs/intq-bits8/data=sphere" in ln and "| mse" in ln]
    assert len(worse) == 1 and worse[0].startswith("| worse |") and "| 10.00 |" in worse[0]
    assert worse[0].endswith("| tolerance: beyond rel 0.05 |")
    assert len(better) == 1 and better[0].startswith("| better |") and "| 0.25 |" in better[0]
    same = [ln for ln in lines if "proofs/intq-bits4/data=sphere" in ln and "| cosine" in ln]
    assert len(same) == 1 and same[0].startswith("| ~ |") and "| 1.00 |" in same[0]
    assert "1 worse" in result.output and "1 better" in result.output


def test_compare_gate_exits_as_run_baseline_would(tiny_run, tmp_path):
    out, _ = tiny_run
    results = out / "results.json"
    same = invoke("compare", results, results, "--gate")
    assert same.exit_code == 0, same.output
    data = load_json(results)
    cases_by_id(data)["proofs/intq-bits4/data=gaussian"]["metrics"]["mse"]["value"] *= 10
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(data))
    gated = invoke("compare", results, worse, "--gate")
    assert gated.exit_code == 1
    assert "gate: exit 1, because:\n  regression: proofs/intq-bits4/data=gaussian mse:" in (
        gated.output)
    assert invoke("compare", results, worse).exit_code == 0  # without --gate: a table only
    cases_by_id(data)["proofs/intq-bits4/data=gaussian"]["method_params"]["bits"] = 2
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    result = invoke("compare", results, other, "--gate")
    assert result.exit_code == 0 and "method_params.bits: 4 -> 2" in result.output
    assert invoke("compare", results, other, "--gate", "--strict").exit_code == 4
    broken = tmp_path / "broken.json"
    broken.write_text(results.read_text()[:100])
    result = invoke("compare", broken, results, "--gate")
    assert result.exit_code == 4
    assert f"{broken}: not valid JSON, truncated or corrupt" in result.output


def test_compare_gate_says_which_claim_failed(tiny_run, tmp_path):
    """Every metric within tolerance, but a claim of B failed: the exit names the claim."""
    out, _ = tiny_run
    results = out / "results.json"
    data = load_json(results)
    case = next(c for c in data["cases"] if c["claims"])
    case["claims"][0]["verdict"] = "failed"
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps(data))
    result = invoke("compare", results, failed, "--gate")
    assert result.exit_code == 1
    claim = case["claims"][0]
    assert f"  claim failed: {case['id']}: {claim['claim']} (measured " in result.output


def test_compare_missing_file_exits_2(tiny_run, tmp_path):
    out, _ = tiny_run
    result = invoke("compare", out / "results.json", tmp_path / "b.json")
    assert result.exit_code == 2 and "b.json does not exist" in result.output


# ---------------------------------------------------------------- list, schema, env


@pytest.mark.parametrize("what, expected", [
    ("methods", ["identity", "intq", "bits=4", "group_size=32"]),
    ("benchmarks", ["proofs", "perplexity", "n_vectors=4096", "context=1024"]),
    ("models", ["bundled:smollm2-135m", "tiny:llama", "tiny:qwen3"]),
])
def test_list(what, expected):
    result = invoke("list", what)
    assert result.exit_code == 0, result.output
    for text in expected:
        assert text in result.output


def test_list_suites_shows_the_suites_folder(tmp_path, monkeypatch):
    (tmp_path / "suites" / "sub").mkdir(parents=True)
    (tmp_path / "suites" / "a.yaml").write_text("kvbench: 1\ndescription: First suite.\n  more\n")
    (tmp_path / "suites" / "sub" / "b.yaml").write_text("kvbench: [\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("list", "suites")
    assert result.exit_code == 0, result.output
    assert re.search(r"suites/a\.yaml\s.*First suite\. more", result.output)
    assert re.search(r"suites/sub/b\.yaml\s.*\(not valid YAML\)", result.output)


def test_list_unknown_kind_exits_2():
    assert invoke("list", "gadgets").exit_code == 2


def test_list_one_benchmark_defines_each_metric():
    result = invoke("list", "benchmarks", "stress")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the table wraps its cells
    # a parameter's row: name, type, default (the table's cells, no longer the docstring's
    # "users: int = 1" line)
    for words in ("tpot_s_p99", "time per output token after the first",
                  "chunk_gap_s_p50", "sessions_held", "│ users │ int │ 1 │"):
        assert words in text, words
    result = invoke("list", "benchmarks", "strss")
    assert result.exit_code == 2 and "Did you mean 'stress'" in result.output
    shown = invoke("list", "methods", "identity")  # methods are described one by one too
    assert shown.exit_code == 0 and "parameters of identity" in shown.output


def test_schema_is_json_with_the_schema_version():
    result = invoke("schema")
    assert result.exit_code == 0
    from kvbench.suite.schema import SCHEMA_VERSION as SUITE_VERSION  # not the results' schema

    schema = json.loads(result.output)
    assert schema["title"] == f"kvbench suite, version {SUITE_VERSION}"
    assert schema["properties"]["kvbench"]["const"] == SUITE_VERSION
    assert "kvbench" in schema["required"]
    assert {"methods", "benchmarks", "defaults", "gate"} <= set(schema["properties"])


def test_env_prints_machine_key_and_python():
    from kvbench.hardware import machine_key

    result = invoke("env", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert f"key: {machine_key('cpu')}" in result.output.splitlines()
    assert f"python: {platform.python_version()}" in result.output.splitlines()
    assert re.search(r"^git_sha: ", result.output, re.M)


def test_version_and_help():
    assert invoke("--version").output.strip().endswith(kvbench.__version__)
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("run", "validate", "report", "compare", "baseline", "list", "schema", "env"):
        assert re.search(rf"^\s+{command}\b", result.output, re.M)
    # every exit code a run can end with, Ctrl-C's included
    codes = " ".join(result.output.split())
    for code in ("0 all claims hold", "1 a claim failed", "2 invalid", "3 a case crashed",
                 "4 baseline", "130 interrupted"):
        assert code in codes, code


def test_python_dash_m_kvbench_is_the_command_line():
    done = subprocess.run([sys.executable, "-m", "kvbench", "--version"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"kvbench, version {kvbench.__version__}"


def test_a_missing_extra_is_named_with_its_install_line_before_any_work(monkeypatch):
    """Without the serve extra, validate refuses the stress suite at its benchmark and serve
    says what to install: exit 2, no traceback."""
    monkeypatch.setitem(sys.modules, "httpx", None)  # as if not installed
    result = invoke("validate", ROOT / "suites" / "stress.yaml")
    assert result.exit_code == 2, result.output
    line = line_of(ROOT / "suites" / "stress.yaml", "- kind: stress")
    assert (f"stress.yaml:{line}" in result.output and "benchmark 'stress' needs the serve extra"
            " (no module httpx): pip install 'kvbench[serve]'" in result.output)
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    served = CliRunner().invoke(cli.main, ["serve", "--model", "tiny:llama"])
    assert served.exit_code == 2 and "Traceback" not in served.output
    assert ("kvbench serve needs the serve extra (no module uvicorn, httpx): pip install"
            " 'kvbench[serve]'") in " ".join(served.output.split())



def test_a_goal_not_met_is_reported_apart_and_does_not_fail_the_run(tmp_path, monkeypatch):
    """A claim stated as a goal (with its reason) that fails reads 'goal not met' with the
    reason, in the terminal and the report; the run exits 0. Met, it is held; a plain claim
    that fails still fails the run."""
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "goals.yaml"
    suite.write_text(f"""kvbench: 1
name: goals
defaults: {{device: cpu, repeats: 1}}
methods: [{{name: tests.plugins.kvb_testplugin:Nop}}]
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Step
    params: {{log: cases.log, sleep_s: 0.0}}
    matrix: {{i: [0, 2]}}
    claims:
      - {{cases: "*i=2", claim: "value <= 1", goal: "not reached yet: the index is 2"}}
      - {{cases: "*i=0", claim: "value <= 1", goal: "met"}}
""")
    result = invoke("run", suite, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "claims held 1/2, failed 0, goals not met 1" in result.output
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| value <= 1 | 2 | ◻ goal not met: not reached yet: the index is 2 |" in report
    assert "| value <= 1 | 0 | ✅ held |" in report
    suite.write_text(suite.read_text().replace(', goal: "met"', "").replace("i=0", "i=2"))
    failed = invoke("run", suite, "--out", tmp_path / "again")
    assert failed.exit_code == 1 and "failed 1, goals not met 1" in failed.output


def test_a_run_records_its_plugins_and_the_gate_says_when_one_changed(tmp_path, monkeypatch):
    """A plug-in's code moved a result under the same fingerprint, and nothing said so: the
    run records each plug-in's source sha256, and compare names the one that changed."""
    import hashlib

    from tests.plugins import kvb_testplugin

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert invoke("run", ROOT / "tests/suites/cli/steps.yaml", "--out", out).exit_code == 0
    data = load_json(out / "results.json")
    source = Path(kvb_testplugin.__file__).read_bytes()
    assert data["plugins"] == {"tests.plugins.kvb_testplugin": {
        "module": "tests.plugins.kvb_testplugin",
        "sha256": hashlib.sha256(source).hexdigest()}}
    assert "plug-in `tests.plugins.kvb_testplugin` (source sha256 `" in (
        out / "report.md").read_text()
    # git_sha is kvbench's own commit, wherever the suite lies
    assert data["git_sha"] and data["git_sha"].split("+")[0] == kvbench_commit()
    data["plugins"]["tests.plugins.kvb_testplugin"]["sha256"] = "0" * 64
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(data))
    result = invoke("compare", changed, out / "results.json")  # A, the baseline, changed
    sha = hashlib.sha256(source).hexdigest()[:12]
    assert (f"plug-in tests.plugins.kvb_testplugin changed: source sha256 {'0' * 12} in the"
            f" baseline, source sha256 {sha} now") in result.output


def kvbench_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(kvbench.__file__).parent)
    return done.stdout.strip()
