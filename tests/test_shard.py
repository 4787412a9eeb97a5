"""`kvbench run --shard i/n` and `kvbench merge`: shards split a suite stably, and merged they
equal the whole run."""
from __future__ import annotations

import json
import random
import re

import pytest

from kvbench.judge.claims import parse_claim
from kvbench.benchmarks import BENCHMARKS
from kvbench.methods import METHODS
from kvbench.run.cost import expected_cost
from kvbench.run.shard import Shard, parse_shard, select_shard, split
from kvbench.suite.case import Case
from tests.plugins.cli_support import invoke, load_json
from tests.plugins.extras import require_extra

SUITE = """\
kvbench: 1
name: steps
methods:
  - name: tests.plugins.kvb_testplugin:Nop
    matrix: {knob: [1, 2, 3]}
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Keeps
    matrix: {i: [1, 2, 3, 4, 5]}
    claims:
      - {cases: "*", claim: "value <= 5"}
      # against another case of the run: the same i with knob 1
      - {cases: "*/Nop-knob2/*", claim: "value / Nop-knob1 == 1"}
"""


def _case(case_id: str, claims=(), params=None, settings=None) -> Case:
    benchmark, label, _ = case_id.split("/")
    return Case(id=case_id, benchmark=benchmark, bench_params={}, method="m", method_label=label,
                method_params={}, model=None, device="cpu", seed=0, repeats=1, timeout_s=None,
                claims=list(claims), params=params, settings=settings)


def _ruler(method: str, length: int, task: str, samples: int = 10) -> Case:
    """A RULER case as a suite expands it, as far as its cost goes."""
    params = BENCHMARKS.get("ruler").Params(length=length, samples=samples, task=task)
    return _case(f"ruler/{method}/length={length},task={task}", params=params,
                 settings=METHODS.get(method)())


def test_parse_shard():
    assert parse_shard("2/4") == Shard(2, 4) and str(parse_shard(" 1 / 2 ")) == "1/2"
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_the_split_is_a_partition_independent_of_order_and_of_filters():
    cases = [_case(f"b/m{m}/x={x}") for m in range(7) for x in range(9)]
    shards = [select_shard(cases, cases, Shard(i, 3)) for i in (1, 2, 3)]
    ids = [c.id for shard in shards for c in shard]
    assert sorted(ids) == sorted(c.id for c in cases)  # every case once
    assert all(len(shard) >= 10 for shard in shards)  # 63 cases: none near empty
    where = {c.id: i for i, shard in enumerate(shards) for c in shard}
    shuffled = cases[:]
    random.Random(1).shuffle(shuffled)
    for i in (1, 2, 3):
        again = select_shard(shuffled, shuffled, Shard(i, 3))
        assert {c.id for c in again} == {c.id for c in shards[i - 1]}
    # a filtered selection keeps each case's shard
    some = cases[::4]
    assert [c.id for c in select_shard(cases, some, Shard(2, 3))] == [
        c.id for c in some if where[c.id] == 1]


# A sweep of mixed lengths, as the field runs one: 1k to 128k, three methods, two tasks.
MIXED = [_ruler(method, 1024 * 2 ** k, task)
         for method in ("identity", "intq", "turbo") for k in range(8)
         for task in ("niah_single_1", "niah_multikey_1")]


@pytest.mark.parametrize("count", [3, 4])
def test_shards_of_mixed_lengths_cost_about_the_same(count):
    """The split by a hash of the id that came before put 2.07x (3 shards) and 2.74x (4) the
    cost of the lightest part in the heaviest."""
    parts = split(MIXED, count)
    # each part's cost is the sum of its cases' (samples x length x the method's relative cost)
    costs = [sum(expected_cost(c) for c in select_shard(MIXED, MIXED, Shard(i, count)))
             for i in range(1, count + 1)]
    assert [part.cost for part in parts] == pytest.approx(costs)
    assert max(costs) <= 1.2 * min(costs), costs
    assert sorted(i for part in parts for i in part.case_ids) == sorted(c.id for c in MIXED)


def test_a_case_costs_its_samples_times_its_length_times_its_method():
    assert expected_cost(_ruler("identity", 4096, "niah_single_1", samples=10)) == 40960
    assert expected_cost(_ruler("turbo", 4096, "niah_single_1", samples=10)) == 1.5 * 40960
    assert expected_cost(_case("b/refused/x=1")) == 0  # recorded, never run


def test_cases_tied_by_a_claim_share_a_shard():
    claim = parse_claim("value / base <= 1")
    cases = []
    for x in range(30):
        cases += [_case(f"b/base/x={x}"), _case(f"b/other/x={x}", [claim])]
    for i in (1, 2):
        ids = {c.id for c in select_shard(cases, cases, Shard(i, 2))}
        for x in range(30):
            assert (f"b/base/x={x}" in ids) == (f"b/other/x={x}" in ids)


def _write_suite(tmp_path, text=SUITE):
    """The suite, to run: the test is skipped without torch (`kvbench run` needs it)."""
    require_extra("torch")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def _shards(tmp_path, suite, count, *extra):
    outs = []
    for i in range(1, count + 1):
        out = tmp_path / f"shard{i}"
        result = invoke("run", suite, "--out", out, "--shard", f"{i}/{count}", *extra)
        assert result.exit_code == 0, result.output
        outs.append(out)
    return outs


def _deterministic(run: dict) -> list:
    return [(c["id"], c["status"], {k: m["value"] for k, m in c["metrics"].items()},
             [(cl["claim"], cl["verdict"], cl["measured"]) for cl in c["claims"]])
            for c in run["cases"]]


def test_merged_shards_equal_the_whole_run(tmp_path):
    suite = _write_suite(tmp_path)
    assert invoke("run", suite, "--out", tmp_path / "whole").exit_code == 0
    whole = load_json(tmp_path / "whole/results.json")
    outs = _shards(tmp_path, suite, 2)
    parts = [load_json(out / "results.json") for out in outs]
    assert [p["settings"]["shard"] for p in parts] == ["1/2", "2/2"]
    # the split is recorded: each part's cases and expected cost, the same in both headers
    split_record = parts[0]["settings"]["split"]
    assert split_record == parts[1]["settings"]["split"]
    assert split_record["cases"] == [len(p["cases"]) for p in parts]
    assert len(split_record["costs"]) == 2
    assert all(p["planned"] == [c["id"] for c in whole["cases"]] for p in parts)
    assert 0 < len(parts[0]["cases"]) < 15
    # every claim against another case was judged inside its shard
    assert all(cl["verdict"] == "held" for p in parts for c in p["cases"] for cl in c["claims"])

    merged = invoke("merge", outs[1], outs[0] / "results.json", "--out", tmp_path / "m")
    assert merged.exit_code == 0, merged.output
    result = load_json(tmp_path / "m/results.json")
    assert _deterministic(result) == _deterministic(whole)  # suite order, whatever the inputs'
    assert [m["shard"] for m in result["settings"]["merged_from"]] == ["2/2", "1/2"]
    assert "split" not in result["settings"]  # whole again
    # the shards' per-sample records are joined, one per case
    kept = [json.loads(line) for line in (tmp_path / "m/predictions.jsonl").open()]
    assert sorted(k["case"] for k in kept) == sorted(c["id"] for c in whole["cases"])
    assert (tmp_path / "m/report.md").exists()
    lines = (tmp_path / "m/results.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 15 and json.loads(lines[0])["type"] == "header"


def test_a_dry_run_shows_the_split_and_each_case_cost(tmp_path):
    suite = tmp_path / "mixed.yaml"
    suite.write_text("""\
kvbench: 1
name: mixed
defaults: {model: "tiny:llama"}
methods: [{name: identity}, {name: turbo, params: {block: 16}}]
benchmarks:
  - kind: ruler
    params: {samples: 2}
    matrix: {length: [256, 512, 1024, 2048]}
""")
    listed = invoke("run", suite, "--dry-run", "--shard", "1/3")
    assert listed.exit_code == 0, listed.output
    rows = dict(re.findall(r"(ruler/\S+)\s+│\s+tiny:llama\s+│\s+(\S+)", listed.output))
    # the heaviest case (2048 tokens x 2 samples x turbo's 1.5) leads shard 1, the lightest
    # (identity at 256) tops it up
    assert rows == {"ruler/turbo/length=2048": "6.14k", "ruler/identity/length=256": "512"}
    flat = " ".join(listed.output.split())
    assert "mixed: 2 case(s), shard 1/3; expected cost 6.66k" in flat
    assert ("the suite's 8 case(s) by expected cost: shard 1/3: 2 case(s), cost 6.66k; shard"
            " 2/3: 3 case(s), cost 6.4k; shard 3/3: 3 case(s), cost 6.14k") in flat


def test_a_missing_shard_is_reported_and_resume_runs_only_its_cases(tmp_path):
    suite = _write_suite(tmp_path)
    first, _ = _shards(tmp_path, suite, 2)
    ran = {c["id"] for c in load_json(first / "results.json")["cases"]}
    merged = invoke("merge", first, "--out", tmp_path / "m")
    assert merged.exit_code == 3
    assert "missing shard(s): 2/2" in merged.output
    assert f"{15 - len(ran)} planned case(s) in no run" in merged.output
    resumed = invoke("run", suite, "--out", tmp_path / "m", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming: {len(ran)} finished case(s) kept, {15 - len(ran)} to run" in resumed.output
    assert len(load_json(tmp_path / "m/results.json")["cases"]) == 15


@pytest.mark.parametrize("change, message", [
    (lambda run, other: run["machine"].update(key="linux-x86_64-nvidia-h100"),
     "machine 'linux-x86_64-cpu'"),
    (lambda run, other: run.update(kvbench_version="0.0.1"), "kvbench version"),
    (lambda run, other: run["suite"]["resolved"]["defaults"].update(seed=99),
     "suite 'steps (hash, timeouts aside, "),
    (lambda run, other: run["settings"].update(repeats=5), "settings"),
    (lambda run, other: run["settings"].update(shard="2/3"), "shards of different splits"),
    (lambda run, other: run["settings"].update(shard="1/2"), "shard 1/2 is given 2 times"),
    (lambda run, other: run["cases"].append(other["cases"][0]), "is in both"),
    (lambda run, other: run.update(planned=run["planned"][1:]), "planned different cases"),
    (lambda run, other: run["plugins"]["tests.plugins.kvb_testplugin"].update(sha256="0" * 64),
     "plug-in tests.plugins.kvb_testplugin is other code in"),
])
def test_merge_refuses_runs_that_are_not_one_run(tmp_path, change, message):
    suite = _write_suite(tmp_path)
    first, second = _shards(tmp_path, suite, 2)
    run = load_json(second / "results.json")
    change(run, load_json(first / "results.json"))
    (second / "results.json").write_text(json.dumps(run))
    merged = invoke("merge", first, second, "--out", tmp_path / "m")
    assert merged.exit_code == 2
    assert message in merged.output
    assert not (tmp_path / "m/results.json").exists()


def test_shards_whose_suites_differ_only_in_timeouts_merge(tmp_path):
    suite = _write_suite(tmp_path)
    first, second = _shards(tmp_path, suite, 2)
    run = load_json(second / "results.json")
    run["suite"]["resolved"]["defaults"]["timeout_s"] = 7200.0  # raised, then resumed
    run["suite"]["hash"] = "0" * 64
    (second / "results.json").write_text(json.dumps(run))
    merged = invoke("merge", first, second, "--out", tmp_path / "m")
    assert merged.exit_code == 0, merged.output
    assert len(load_json(tmp_path / "m/results.json")["cases"]) == 15


def test_mixed_machines_merge_when_allowed(tmp_path):
    suite = _write_suite(tmp_path)
    first, second = _shards(tmp_path, suite, 2)
    run = load_json(second / "results.json")
    run["machine"]["key"] = "linux-x86_64-other"
    (second / "results.json").write_text(json.dumps(run))
    assert invoke("merge", first, second, "--out", tmp_path / "m").exit_code == 2
    merged = invoke("merge", first, second, "--out", tmp_path / "m", "--allow-mixed")
    assert merged.exit_code == 0, merged.output
    cases = load_json(tmp_path / "m/results.json")["cases"]
    by_id = {c["id"]: c["info"]["machine"] for c in cases}
    assert {by_id[c["id"]] for c in run["cases"]} == {"linux-x86_64-other"}
    assert set(by_id.values()) == {"linux-x86_64-cpu", "linux-x86_64-other"}


def test_an_empty_shard_writes_an_empty_run_that_merges(tmp_path):
    # one case: one of two shards holds nothing
    suite = _write_suite(tmp_path, SUITE.replace("[1, 2, 3, 4, 5]", "[1]").replace(
        "[1, 2, 3]", "[1]").replace('      - {cases: "*/Nop-knob2/*", claim: "value / Nop-knob1 '
                                    '== 1"}\n', ""))
    outs = _shards(tmp_path, suite, 2)
    sizes = sorted(len(load_json(out / "results.json")["cases"]) for out in outs)
    assert sizes == [0, 1]
    merged = invoke("merge", *outs, "--out", tmp_path / "m")
    assert merged.exit_code == 0, merged.output
    assert len(load_json(tmp_path / "m/results.json")["cases"]) == 1


def test_a_sharded_run_resumes_only_as_the_same_shard(tmp_path):
    suite = _write_suite(tmp_path)
    first, _ = _shards(tmp_path, suite, 2)
    again = invoke("run", suite, "--out", first, "--resume", "--shard", "2/2")
    assert again.exit_code == 2
    assert "shard '1/2' then, '2/2' now" in again.output


def test_a_merged_run_gates_against_a_whole_baseline(tmp_path):
    suite = _write_suite(tmp_path)
    assert invoke("run", suite, "--out", tmp_path / "whole").exit_code == 0
    outs = _shards(tmp_path, suite, 2)
    assert invoke("merge", *outs, "--out", tmp_path / "m").exit_code == 0
    gated = invoke("compare", tmp_path / "whole/results.json", tmp_path / "m/results.json",
                   "--gate")
    assert gated.exit_code == 0, gated.output


def test_parts_run_apart_merge_into_the_whole_run(tmp_path):
    suite = _write_suite(tmp_path)
    assert invoke("run", suite, "--out", tmp_path / "whole").exit_code == 0
    whole = load_json(tmp_path / "whole/results.json")
    # one part as two shards (knob2's claims against knob1 stay in it), the other whole
    tied = _shards(tmp_path, suite, 2, "--methods", "Nop-knob1,Nop-knob2")
    alone = invoke("run", suite, "--out", tmp_path / "knob3", "--methods", "Nop-knob3")
    assert alone.exit_code == 0, alone.output
    merged = invoke("merge", tied[1], tmp_path / "knob3", tied[0], "--out", tmp_path / "m")
    assert merged.exit_code == 0, merged.output
    result = load_json(tmp_path / "m/results.json")
    assert sorted(_deterministic(result)) == sorted(_deterministic(whole))
    # part by part, as given, each in the suite's order
    assert result["planned"] == [i for i in whole["planned"] if "knob3" not in i] + [
        i for i in whole["planned"] if "knob3" in i]
    assert [c["id"] for c in result["cases"]] == result["planned"]
    # a missing shard is named with its part
    partial = invoke("merge", tmp_path / "knob3", tied[0], "--out", tmp_path / "p")
    assert partial.exit_code == 3
    flat = "".join(partial.output.split())  # as wrapped to the terminal's width
    assert f"missingshard(s):2/2(thepartof{tied[0] / 'results.json'})" in flat


def test_parts_of_different_commits_merge_when_allowed_and_keep_their_commits(tmp_path):
    suite = _write_suite(tmp_path)
    outs = [tmp_path / label for label in ("knob1", "knob3")]
    for out, label in zip(outs, ("Nop-knob1", "Nop-knob3")):
        assert invoke("run", suite, "--out", out, "--methods", label).exit_code == 0
    run = load_json(outs[1] / "results.json")
    run["git_sha"] = "f" * 40
    (outs[1] / "results.json").write_text(json.dumps(run))
    refused = invoke("merge", *outs, "--out", tmp_path / "m")
    assert refused.exit_code == 2 and "git commit" in refused.output
    merged = invoke("merge", *outs, "--out", tmp_path / "m", "--allow-mixed")
    assert merged.exit_code == 0, merged.output
    commits = {c["id"]: c["info"]["git_sha"]
               for c in load_json(tmp_path / "m/results.json")["cases"]}
    assert {commits[c["id"]] for c in run["cases"]} == {"f" * 40}
    assert len(set(commits.values())) == 2 and len(commits) == 10
