"""Output-length drift: each method's answer lengths paired with identity's on the same prompts
(kvbench.reportkit.drift), in the ruler and niah reports; and a forked cache goes on exactly
as the original would (what answering one compressed context several ways stands on)."""
from __future__ import annotations

import pytest
import torch

from kvbench.benchmarks.reports.niah import niah_section
from kvbench.benchmarks.reports.ruler import ruler_section
from kvbench.reportkit.drift import drift_scopes, length_drift_section
from kvbench.results import CaseResult, Metric, RunResult, SuiteRecord


def _case(label: str, method: str, generated: list[int], seconds: list[float] | None = None,
          benchmark: str = "ruler", length: int = 1024, prompts: str = "same") -> CaseResult:
    scores = [100.0] * len(generated)
    info = {"scores": scores, "generated": generated,
            "prompt_sha256s": [f"{prompts}{i}" for i in range(len(generated))]}
    if seconds is not None:
        info["answer_s"] = seconds
    if benchmark == "niah":
        info["grid"] = {"lengths": [length], "depths": [50], "scores": [[100.0]]}
    return CaseResult(
        id=f"{benchmark}/{label}/length={length}", benchmark=benchmark,
        bench_params={"task": "niah_single_1", "length": length, "samples": len(generated)},
        method=method, method_label=label, method_params={}, model="tiny:llama", status="ok",
        metrics={"score": Metric(value=100.0, unit="%", direction="higher"),
                 "compression_ratio": Metric(value=2.0, unit="x", direction="higher")},
        info=info, comparable={"prompts_sha256": prompts})


def _run(cases: list[CaseResult]) -> RunResult:
    return RunResult(kvbench_version="0.1.0", git_sha=None, machine={"key": "test"},
                     suite=SuiteRecord(name="drift", path="drift.yaml", hash="0" * 64,
                                       resolved={}),
                     started="2026-01-01T00:00:00+00:00", cases=cases)


IDENTITY = [10, 12, 9, 11, 10, 12, 9, 11, 10, 12]


def _row(section: str, label: str) -> list[str]:
    [line] = [line for line in section.splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_method_that_talks_longer_is_seen_and_one_that_does_not_is_not():
    longer = [n + 8 for n in IDENTITY]  # every answer 8 tokens longer: p = 2 / 2**10
    same = list(IDENTITY)
    result = _run([_case("identity", "identity", IDENTITY, [1.0] * 10),
                   _case("wordy", "intq", longer, [1.5] * 10),
                   _case("steady", "snapkv", same, [1.0] * 10)])
    section = length_drift_section(result, "ruler", lambda case: "1K", "one sample")
    wordy, steady = _row(section, "wordy"), _row(section, "steady")
    # method, scope, pairs, identity tokens, method tokens, Δ [CI], longer/shorter, p, verdict, Δ s
    assert wordy[2:7] == ["10", "10.6", "18.6", "+8.0 [+8.0, +8.0]", "10 / 0"]
    assert wordy[7:9] == ["0.002", "longer"]
    assert wordy[9].startswith("+0.500")
    assert steady[6:9] == ["0 / 0", "1.000", "not separated"]


def test_shorter_answers_and_no_identity_and_other_prompts():
    shorter = [n - 5 for n in IDENTITY]
    result = _run([_case("identity", "identity", IDENTITY), _case("terse", "intq", shorter)])
    section = length_drift_section(result, "ruler", lambda case: "1K", "one sample")
    assert _row(section, "terse")[8] == "shorter"
    assert _row(section, "terse")[9] == "—"  # no answer times recorded: no time column
    # nothing to pair: no identity, or identity on other prompts
    assert length_drift_section(_run([_case("terse", "intq", shorter)]), "ruler",
                                lambda case: "1K", "one sample") is None
    other = _run([_case("identity", "identity", IDENTITY, prompts="other"),
                  _case("terse", "intq", shorter)])
    assert drift_scopes(other.cases, lambda case: "1K") == []


def test_scopes_pool_the_cases_of_one_method_and_scope():
    result = _run([_case("identity", "identity", IDENTITY[:5], length=1024),
                   _case("identity", "identity", IDENTITY[5:], length=2048),
                   _case("wordy", "intq", IDENTITY[:5], length=1024),
                   _case("wordy", "intq", IDENTITY[5:], length=2048)])
    [pooled] = drift_scopes(result.cases, lambda case: "all lengths")
    assert pooled.flat(pooled.tokens) == (IDENTITY, IDENTITY)
    per_length = drift_scopes(result.cases, lambda case: str(case.bench_params["length"]))
    assert [(s.scope, len(s.flat(s.tokens)[0])) for s in per_length] == [("1024", 5),
                                                                           ("2048", 5)]


def test_the_ruler_and_niah_sections_carry_the_drift_table():
    cases = [_case("identity", "identity", IDENTITY), _case("wordy", "intq",
                                                            [n + 8 for n in IDENTITY])]
    ruler = ruler_section(_run(cases))
    assert "### RULER: output length, paired with identity's answers" in ruler
    assert _row(ruler.split("output length, paired")[1], "wordy")[8] == "longer"
    # the score verdicts the results page gathers are not mixed with the length verdicts
    from kvbench.report.against_identity import MARK
    assert MARK not in ruler.split("output length, paired")[1].splitlines()[0]
    niah = niah_section(_run([c.model_copy(update={"benchmark": "niah"}) for c in
                              [_case(c.method_label, c.method, c.info["generated"],
                                     benchmark="niah") for c in cases]]))
    assert "### NIAH: output length, paired with identity's answers" in niah


@pytest.mark.model
@pytest.mark.parametrize("name, params", [("identity", {}), ("intq", {"bits": 4}),
                                          ("snapkv", {"ratio": 0.25}),
                                          ("turbo", {"bits": 3, "block": 64})])
def test_a_forked_cache_goes_on_as_the_original_and_apart_from_it(bundled_session, name,
                                                                   params):
    from kvbench.methods import build_method, implementation
    from kvbench.models.session import prefill

    session = bundled_session
    method = implementation(build_method(name, params))
    ids = session.tokenizer.encode("The code word is heron. " * 40)[:240]

    def prefilled():
        cache = session.new_cache(method, decoded_reads=True)
        prefill(session, cache, ids, method)
        return cache

    def next_logits(cache) -> list[torch.Tensor]:
        return [session.step([token], cache)[0] for token in ids[:4]]

    original = prefilled()
    fork = session.fork(original)
    assert fork is not original and fork.accounted_bytes() == original.accounted_bytes()
    for token in ids[100:110]:  # the fork reads other tokens first: the original must not
        session.step([token], fork)
    fresh = next_logits(prefilled())
    assert all(torch.equal(a, b) for a, b in zip(next_logits(original), fresh))
    assert all(torch.equal(a, b) for a, b in zip(next_logits(session.fork(prefilled())), fresh))


def test_a_forked_mlx_cache_goes_on_as_the_original_and_apart_from_it(tiny_mlx_session):
    from kvbench.methods import build_method, implementation
    from kvbench.models.session import prefill

    session = tiny_mlx_session
    method = implementation(build_method("intq", {"bits": 4}), "mlx")
    ids = list(range(5, 105))

    def prefilled():
        cache = session.new_cache(method)
        prefill(session, cache, ids, method)
        return cache

    original = prefilled()
    fork = session.fork(original)
    for token in ids[50:60]:
        session.step([token], fork)
    fresh = [session.step([t], prefilled())[0] for t in ids[:1]]
    mine = [session.step([t], original)[0] for t in ids[:1]]
    assert all(torch.equal(a, b) for a, b in zip(mine, fresh))


def test_a_claim_on_generated_tokens_pairs_the_samples():
    from kvbench.judge.paired import paired_samples

    wordy = _case("wordy", "intq", [n + 1 for n in IDENTITY])
    assert paired_samples(wordy, _case("identity", "identity", IDENTITY),
                          "generated_tokens") == ([n + 1 for n in IDENTITY], IDENTITY)
    assert paired_samples(wordy, _case("identity", "identity", IDENTITY, prompts="other"),
                          "generated_tokens") is None
