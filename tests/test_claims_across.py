"""Claims that set a case against another case of the same run: `metric / LABEL op value` (a
ratio) and `metric - LABEL op value` (a difference), LABEL's case having the same benchmark
parameters."""
from __future__ import annotations

import pytest

from kvbench.judge.claims import parse_claim
from kvbench.results import ClaimResult
from kvbench.run.runner import run_suite
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.suites import line_of

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SUITE = """\
kvbench: 1
defaults: {model: "tiny:llama", device: cpu}
methods:
  - name: identity
  - name: intq
    label: intq-4
    params: {bits: 4}
benchmarks:
  - kind: perplexity
    params: {continuation: 4, calibration: 0}
    matrix: {context: [24, 40]}
    claims:
      - {cases: "perplexity/intq-4/*", claim: "kv_bytes / identity <= 0.5"}
      - {cases: "perplexity/intq-4/*", claim: "kv_bytes - identity < 0"}
      - {cases: "perplexity/intq-4/*", claim: "kv_bytes / identity > 0.5"}
"""


@pytest.mark.parametrize("text, metric, relation, reference, op, target", [
    ("peak_bytes / identity <= 0.51", "peak_bytes", "/", "identity", "<=", 0.51),
    ("top_k_overlap - butterfly-local_only >= -0.04", "top_k_overlap", "-",
     "butterfly-local_only", ">=", -0.04),
    ("e2e_s/identity<=1.06", "e2e_s", "/", "identity", "<=", 1.06),
    ("cosine >= 0.99", "cosine", None, None, ">=", 0.99),
])
def test_parse(text, metric, relation, reference, op, target):
    claim = parse_claim(text)
    assert (claim.metric, claim.relation, claim.reference, claim.op, claim.target) == (
        metric, relation, reference, op, target)


def test_the_reference_case_has_the_same_parameters():
    claim = parse_claim("peak_bytes / identity <= 1")
    assert claim.reference_id("ladder/butterfly-x/length=1024", "ladder", "butterfly-x") == (
        "ladder/identity/length=1024")
    assert claim.reference_id("perplexity/intq", "perplexity", "intq") == "perplexity/identity"


@pytest.fixture(scope="module")
def across_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("across")
    (folder / "s.yaml").write_text(SUITE)
    suite = load_suite(folder / "s.yaml")
    return suite, run_suite(suite, folder / "out").result


def test_judged_against_the_same_rung_of_the_reference(across_run):
    _, result = across_run
    cases = {c.id: c for c in result.cases}
    for context in (24, 40):
        mine = cases[f"perplexity/intq-4/context={context}"]
        plain = cases[f"perplexity/identity/context={context}"]
        ratio = mine.metrics["kv_bytes"].value / plain.metrics["kv_bytes"].value
        difference = mine.metrics["kv_bytes"].value - plain.metrics["kv_bytes"].value
        verdicts = [(c.claim, c.measured, c.verdict, c.reference) for c in mine.claims]
        assert verdicts == [
            ("kv_bytes / identity <= 0.5", pytest.approx(ratio), "held", plain.id),
            ("kv_bytes - identity < 0", difference, "held", plain.id),
            ("kv_bytes / identity > 0.5", pytest.approx(ratio), "failed", plain.id),
        ]
        assert plain.claims == []


def test_a_reference_that_did_not_run_leaves_the_claim_missing(across_run, tmp_path):
    suite, _ = across_run
    only = [c for c in suite.cases if c.id == "perplexity/intq-4/context=24"]
    result = run_suite(suite, tmp_path / "only", cases=only).result
    [case] = result.cases
    assert {c.verdict for c in case.claims} == {"missing"}
    assert {c.reference for c in case.claims} == {"perplexity/identity/context=24"}


def test_an_unknown_reference_is_refused_at_its_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(SUITE.replace("kv_bytes - identity", "kv_bytes - identiti"))
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    text = str(err.value)
    assert f"bad.yaml:{line_of(path, 'identiti')}" in text
    assert "compares with method 'identiti', which benchmark 'perplexity' does not run" in text
    assert "identity" in text  # the suggestion


def test_a_claim_recorded_before_paired_bounds_still_loads():
    old = {"claim": "kv_bytes - identity < 0", "metric": "kv_bytes", "op": "<", "target": 0,
           "measured": -10.0, "verdict": "held", "reference": "perplexity/identity"}
    assert ClaimResult.model_validate(old).measured_as is None  # the difference itself
