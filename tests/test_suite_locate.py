"""A SUITE argument: a file path as before, or the name of a suite shipped with kvbench
(`kvbench run quick`), read from the package (kvbench.suite.locate). The installed wheel is
tested in tests/test_installed_wheel.py."""
from __future__ import annotations

import re

import pytest

from kvbench.cli.common import load_suite_or_exit
from kvbench.suite.loader import load_suite
from kvbench.suite.locate import SuiteNotFound, locate_suite, shipped_folder, shipped_suites
from tests.plugins.cli_support import invoke
from tests.plugins.extras import needs
from tests.plugins.suites import ROOT

SUITES = ROOT / "suites"


def test_every_suite_of_the_checkout_is_shipped_by_its_name():
    names = {p.relative_to(SUITES).with_suffix("").as_posix() for p in SUITES.rglob("*.yaml")}
    assert set(shipped_suites()) == names
    assert shipped_folder() == SUITES.resolve()  # in the checkout, the very files one edits


def test_a_name_and_the_repo_path_load_the_same_suite():
    """The suite's hash does not depend on how it was named: runs and baselines made from
    suites/quick.yaml stay comparable with `kvbench run quick`."""
    by_path = load_suite(SUITES / "quick.yaml")
    by_name = load_suite(locate_suite("quick"))
    assert (by_name.hash, by_name.resolved) == (by_path.hash, by_path.resolved)
    assert load_suite(locate_suite("seeds/turboquant")).name == load_suite(
        SUITES / "seeds" / "turboquant.yaml").name


def test_an_include_in_a_shipped_suite_is_found_beside_it():
    text = (SUITES / "cuda-e2e-bf16.yaml").read_text()
    assert re.search(r"^include: \[cuda-e2e\.yaml\]", text, re.M)  # what this test relies on
    suite = load_suite(locate_suite("cuda-e2e-bf16"))
    included = load_suite(SUITES / "cuda-e2e.yaml")
    assert suite.resolved["methods"] == included.resolved["methods"]
    assert {case.id for case in suite.cases} == {case.id for case in included.cases}


def test_an_existing_file_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick").write_text("kvbench: 1\n")
    assert locate_suite("quick") == "quick"
    assert locate_suite(str(SUITES / "quick.yaml")) == str(SUITES / "quick.yaml")


def test_a_missing_yaml_path_is_left_to_the_loader_unless_a_shipped_suite_has_its_name(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no suites/ folder here
    assert locate_suite("mine.yaml") == "mine.yaml"
    assert locate_suite("myquick.yaml") == "myquick.yaml"  # not quick: a whole name only
    with pytest.raises(SuiteNotFound, match=r"suites/quick\.yaml; kvbench ships .* `quick`"):
        locate_suite("suites/quick.yaml")
    with pytest.raises(SuiteNotFound, match="`seeds/turboquant`"):
        locate_suite("suites/seeds/turboquant.yaml")


def test_an_unknown_name_lists_the_shipped_ones_the_nearest_first():
    with pytest.raises(SuiteNotFound) as caught:
        locate_suite("quik")
    message = str(caught.value)
    assert "'quik' (did you mean quick?)" in message
    for name in shipped_suites():
        assert name in message


def test_validate_takes_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout: no ./suites to read
    count = len(load_suite(SUITES / "quick.yaml").cases)
    result = invoke("validate", "quick")
    assert result.exit_code == 0, result.output
    assert f"valid: quick: {count} case(s)" in result.output
    wrong = invoke("validate", "quik")
    assert wrong.exit_code == 2 and "did you mean quick?" in wrong.output


@needs("torch")  # run asks for it first
def test_run_takes_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)  # a set width folds the table's ids
    listed = invoke("run", "quick", "--dry-run", "--only", "proofs/identity/*")
    assert listed.exit_code == 0, listed.output
    ids = [case.id for case in load_suite(SUITES / "quick.yaml").cases
           if case.id.startswith("proofs/identity/")]
    assert ids and all(case_id in listed.output for case_id in ids), listed.output


def test_a_run_records_the_suite_as_it_was_named(tmp_path, monkeypatch):
    """What the results, the resume hint and the refresh command say runs it again."""
    monkeypatch.chdir(tmp_path)
    assert load_suite_or_exit("quick").path == "quick"
    assert load_suite_or_exit(str(SUITES / "quick.yaml")).path == str(SUITES / "quick.yaml")


def test_list_suites_names_the_shipped_suites_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("list", "suites")
    assert result.exit_code == 0, result.output
    rows = {line.strip("│ ").split(" ")[0] for line in result.output.splitlines()}
    assert set(shipped_suites()) <= rows


def test_the_python_api_takes_a_name_too(tmp_path, monkeypatch):
    import kvbench

    monkeypatch.chdir(tmp_path)  # outside the checkout
    assert kvbench.load_suite("quick").hash == load_suite(SUITES / "quick.yaml").hash
    with pytest.raises(SuiteNotFound, match="did you mean quick"):
        kvbench.load_suite("quik")
