"""The multiturn benchmark (SCBench's two modes over one shared context): its data (one essay
haystack, a needle per turn, deterministic, each turn's answer in the context), the conversation
as the chat template renders it, runs of both modes through `kvbench run` with their records,
report and figure, multi-request's forks answering as fresh single-turn prompts, and, at the
shipped suite's settings, a method that drops the context after turn 1 separated from identity
on every later turn."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure.answering import ChatFrame, Prompt, answer_all
from kvbench.benchmarks.measure.multiturn import PLAIN_BETWEEN, Plan, between_turns
from kvbench.benchmarks.measure.retrieval import Reader
from kvbench.benchmarks.reports.multiturn import MODES, multiturn_section
from kvbench.benchmarks.specs.multiturn import Multiturn, MultiturnParams
from kvbench.data.multiturn import make_conversation
from kvbench.data.ruler import make_sample
from kvbench.data.ruler.tasks import NEEDLE
from kvbench.data.text import load_text
from kvbench.judge.paired import compare_paired
from kvbench.methods import implementation
from kvbench.methods.settings.base import build_method
from kvbench.results import load_results
from kvbench.run.files import PREDICTIONS
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import invoke, wide_consoles  # noqa: F401
from tests.plugins.model_runs import cpu_context
from tests.plugins.suites import ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FORGETFUL = "tests.plugins.forgetful:Forgetful"
SHIPPED = ROOT / "suites" / "multiturn.yaml"


def words(sample) -> int:
    """A stand-in token count: words of the prompt."""
    return len((sample.context + sample.question + sample.answer_prefix).split())


@pytest.fixture(scope="module")
def essay() -> str:
    return load_text("pydoc")


# ---------------------------------------------------------------- data


def test_a_conversation_is_one_haystack_with_a_needle_per_turn(essay):
    made = make_conversation(3, turns=4, length=1024, count_tokens=words, seed=7, essay=essay)
    assert made == make_conversation(3, turns=4, length=1024, count_tokens=words, seed=7,
                                     essay=essay)
    assert 0.99 * 1024 <= words(made.sample) + 128 <= 1024  # RULER's tokens to generate counted
    keys = [turn.key for turn in made.turns]
    assert len(keys) == 4 and len(set(keys)) == 4
    for turn in made.turns:
        (value,) = turn.references
        assert re.fullmatch(r"\d{7}", value)
        assert NEEDLE.format(type_needle_v="numbers", key=turn.key, value=value) in made.context
        assert turn.question == (f"\nWhat is the special magic number for {turn.key} mentioned"
                                 " in the provided text?")
        assert turn.answer_prefix == (f" The special magic number for {turn.key} mentioned in"
                                      " the provided text is")
        assert turn.message == turn.question.lstrip("\n")
        assert 0 <= turn.depth <= 100
    # the fitted sample asks the first turn's question
    assert made.sample.question == made.turns[0].question
    assert made.context.startswith("Some special magic numbers are hidden")
    # every setting draws another conversation
    for other in ({"index": 4}, {"seed": 8}, {"turns": 3}, {"length": 900}):
        settings = {"index": 3, "turns": 4, "length": 1024, "seed": 7, **other}
        index = settings.pop("index")
        assert make_conversation(index, count_tokens=words, essay=essay, **settings) != made


def test_the_keys_are_asked_in_another_order_than_the_text_has_them(essay):
    """Later turns are not all about the end of the context: over a few conversations, the
    asked order differs from the needles' order in the text, and the depths follow the keys."""
    orders = []
    for index in range(6):
        made = make_conversation(index, turns=4, length=700, count_tokens=words, seed=0,
                                 essay=essay)
        depths = [turn.depth for turn in made.turns]
        where = [made.context.index(f"for {turn.key} is:") for turn in made.turns]
        # a needle further into the text is never at a smaller depth
        assert sorted(range(4), key=where.__getitem__) == sorted(
            range(4), key=lambda t: (depths[t], where[t]))
        orders.append(where == sorted(where))
    assert not all(orders)


def test_ruler_samples_record_the_keys_they_ask(essay):
    sample = make_sample("niah_multiquery", 0, length=800, count_tokens=words, seed=0,
                         essay=essay)
    assert len(sample.queries) == 4
    for key, value in zip(sample.queries, sample.references, strict=True):
        assert f"for {key} is: {value}." in sample.context
        assert key in sample.question


# ---------------------------------------------------------------- the conversation's tokens


def test_a_model_without_a_template_parts_its_turns_by_a_blank_line():
    assert between_turns(SimpleNamespace(chat_template=None)) == PLAIN_BETWEEN == "\n\n"


@pytest.mark.model
def test_the_conversation_is_what_the_chat_template_renders(bundled, essay):
    tokenizer = bundled.tokenizer
    assert between_turns(tokenizer) == "<|im_end|>\n<|im_start|>user\n"
    chat = ChatFrame.of(tokenizer)
    made = make_conversation(0, turns=3, length=512, count_tokens=words, seed=0, essay=essay)
    plan = Plan.of(tokenizer, chat, made, between_turns(tokenizer))
    first, second = made.turns[0], made.turns[1]
    answer = tokenizer.encode(" 1234567.", add_special_tokens=False)
    # the first answer ended at end-of-sequence: nothing unfed, the template's close follows
    fed = plan.context + plan.asked[0] + answer + plan.later[0]
    whole = tokenizer.apply_chat_template(
        [{"role": "user", "content": made.context + first.question},
         {"role": "assistant", "content": first.answer_prefix + " 1234567."},
         {"role": "user", "content": second.message}],
        tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(fed) == whole + second.answer_prefix
    # what a prompt hash covers: the context and the turn's question as one request asks it
    assert tokenizer.decode(plan.context + plan.asked[1]).endswith(
        second.question + chat.after + second.answer_prefix)


# ---------------------------------------------------------------- runs


SUITE = """\
kvbench: 1
name: multiturn-tiny
defaults: {model: "bundled:smollm2-135m", device: cpu, threads: 1}
methods:
  - {name: identity}
  - {name: %s, label: forgetful}
  - {name: streamingllm, params: {ratio: 0.25}}
benchmarks:
  - kind: multiturn
    params: {samples: 3, turns: 2, length: 512, answer_tokens: 12}
    matrix:
      mode: [multi-turn, multi-request]
""" % FORGETFUL


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """identity, the forgetful method and streamingllm, both modes, through `kvbench run`
    (shared)."""
    folder = tmp_path_factory.mktemp("multiturn")
    suite = folder / "suite.yaml"
    suite.write_text(SUITE)
    result = invoke("run", suite, "--out", folder / "out")
    assert result.exit_code == 0, result.output
    return folder / "out"


@pytest.mark.model
def test_both_modes_run_end_to_end_and_keep_every_answer(tiny_run):
    run = load_results(tiny_run / "results.json")
    cases = {(c.method_label, c.bench_params["mode"]): c for c in run.cases}
    assert len(cases) == 6 and all(c.status == "ok" for c in cases.values())
    kept = [json.loads(line) for line in (tiny_run / PREDICTIONS).read_text().splitlines()]
    for (label, mode), case in cases.items():
        info = case.info
        assert info["order"].startswith("sample-major")
        for name in ("scores", "prompt_sha256s", "generated", "answer_s"):
            assert len(info[name]) == 3 * 2, name
        assert info["sample_scores"] == [info["scores"][i:i + 2] for i in (0, 2, 4)]
        mine = [r for r in kept if r["case"] == case.id]
        assert sorted((r["index"], r["turn"]) for r in mine) == [(i, t) for i in range(3)
                                                                 for t in (1, 2)]
        by_place = {(r["index"], r["turn"]): r for r in mine}
        assert info["scores"] == [by_place[(i, t)]["score"] for i in range(3) for t in (1, 2)]
        assert info["prompt_sha256s"] == [by_place[(i, t)]["prompt_sha256"]
                                          for i in range(3) for t in (1, 2)]
        assert all(0 < r["generated"] <= 12 for r in mine)
        assert case.metrics["score"].value == pytest.approx(sum(info["scores"]) / 6)
        assert case.metrics["score_first"].value == info["turn_scores"][0]
        assert case.metrics["score_last"].value == info["turn_scores"][1]
        assert case.metrics["turn_slope"].value == pytest.approx(
            info["turn_scores"][1] - info["turn_scores"][0])
    identity_mt, identity_mr = cases["identity", "multi-turn"], cases["identity", "multi-request"]
    # the same contexts and questions in both modes and for both methods
    assert len({c.comparable["prompts_sha256"] for c in cases.values()}) == 1
    # the cache grows over a conversation; each request starts from the same context
    held = identity_mt.info["turn_retained_bytes"]
    assert held[1] > held[0]
    assert identity_mr.info["turn_retained_bytes"][1] < held[1]
    # both modes ask the first question alike
    assert identity_mt.info["scores"][0::2] == identity_mr.info["scores"][0::2]
    # the forgetful method forgets only at a new turn after an answer: in multi-request it
    # answers as identity; in multi-turn it holds only the turn it is in
    forgetful_mr, forgetful_mt = cases["forgetful", "multi-request"], cases["forgetful",
                                                                            "multi-turn"]
    assert forgetful_mr.info["scores"] == identity_mr.info["scores"]
    assert forgetful_mt.info["scores"][0::2] == identity_mt.info["scores"][0::2]
    assert forgetful_mt.info["turn_retained_bytes"][1] < held[0] / 5
    # a fork of an evicted cache goes on as the cache itself: both modes' first answers agree,
    # and streamingllm holds its budget whatever the turn
    first = {mode: [r["prediction"] for r in kept if r["turn"] == 1
                    and r["case"] == cases["streamingllm", mode].id] for mode in MODES}
    assert first["multi-turn"] == first["multi-request"]
    streaming = cases["streamingllm", "multi-turn"].info["turn_retained_bytes"]
    assert streaming[0] == streaming[1] < held[0] / 3
    report = (tiny_run / "report.md").read_text()
    for mode in ("multi-turn", "multi-request"):
        assert f"### multiturn ({mode}): score per turn [95% CI]" in report
        assert f"### multiturn ({mode}): against identity, on the same samples" in report
        assert f"| forgetful | {mode} · 2 |" in report
    assert "### multiturn: output length, paired with identity's answers" in report
    pytest.importorskip("matplotlib")
    assert (tiny_run / "multiturn_score_per_turn.png").stat().st_size > 0


def test_query_aware_compression_is_refused_for_independent_requests(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE.replace("answer_tokens: 12", "answer_tokens: 12, compress:"
                                   " context+question"))
    with pytest.raises(SuiteError, match="use compress: context there"):
        load_suite(suite)


def test_the_model_must_hold_the_whole_conversation(tmp_path):
    suite = tmp_path / "suite.yaml"
    # 3000 tokens of context and 79 later turns are above the bundled model's 8192; one request
    # of them is not
    suite.write_text(SUITE.replace("length: 512", "length: 3000").replace("turns: 2",
                                                                           "turns: 80"))
    with pytest.raises(SuiteError, match="later turns"):
        load_suite(suite)
    suite.write_text(SUITE.replace("length: 512", "length: 3000")
                     .replace("turns: 2", "turns: 80")
                     .replace("mode: [multi-turn, multi-request]", "mode: [multi-request]"))
    load_suite(suite)


@pytest.mark.model
def test_each_request_answers_as_a_fresh_prompt_would(bundled):
    """multi-request's forks: identity's answer to each turn's question is the one a fresh
    single-turn prompt of the same context and question gets."""
    ctx = cpu_context(loaded=bundled)
    kept = []
    ctx.keep = kept.append
    params = MultiturnParams(mode="multi-request", samples=2, turns=3, length=512,
                             answer_tokens=12)
    method = implementation(build_method("identity"))
    out = measurement(Multiturn).run(params, method, ctx)
    reader = Reader.open(ctx, method, params.essay)
    between = between_turns(reader.session.tokenizer)
    from kvbench.benchmarks.measure.multiturn import conversation

    plans = [Plan.of(reader.session.tokenizer, reader.chat, conversation(reader, params, i),
                     between) for i in range(2)]
    prompts = [Prompt(plan.context, asked) for plan in plans for asked in plan.asked]
    fresh = answer_all(reader.session, method, prompts, "context", [12] * len(prompts))
    by_place = {(r["index"], r["turn"]): r["prediction"] for r in kept}
    assert [by_place[(i, t)] for i in range(2) for t in (1, 2, 3)] == [a.text for a in fresh]
    assert out.info["generated"] == [a.generated for a in fresh]


# ---------------------------------------------------------------- separation


def _verdicts(report: str, label: str, mode: str) -> dict[int, str]:
    found = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] == label and cells[1].startswith(f"{mode} · "):
            found[int(cells[1].rpartition(" ")[2])] = cells[6]
    return found


@pytest.mark.slow  # about 3 minutes here: 2 x 24 contexts x 4 turns
@pytest.mark.model
def test_a_method_that_drops_the_context_is_worse_on_every_later_turn(tmp_path):
    """At the shipped suite's samples, turns and length: the forgetful method answers turn 1 as
    identity does (not separated) and is worse on every later turn; identity is not separated
    from itself."""
    [params] = {json.dumps({k: c.bench_params[k] for k in ("samples", "turns", "length",
                                                           "answer_tokens")}, sort_keys=True)
                for c in load_suite(SHIPPED).cases}
    shipped = json.loads(params)
    suite = tmp_path / "suite.yaml"
    body = SUITE.replace("  - {name: streamingllm, params: {ratio: 0.25}}\n", "")
    suite.write_text(body.replace(
        "params: {samples: 3, turns: 2, length: 512, answer_tokens: 12}",
        "params: " + json.dumps(shipped)).replace("[multi-turn, multi-request]", "[multi-turn]"))
    result = invoke("run", suite, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    run = load_results(tmp_path / "out" / "results.json")
    report = multiturn_section(run)
    verdicts = _verdicts(report, "forgetful", "multi-turn")
    turns = shipped["turns"]
    assert verdicts == {1: "not separated", **{t: "worse" for t in range(2, turns + 1)}}, report
    identity = next(c for c in run.cases if c.method == "identity")
    for turn in range(turns):
        scores = identity.info["scores"][turn::turns]
        assert compare_paired(scores, scores).verdict == "not separated"
    # what separates: identity finds most needles (70.8 on every turn here, 24 contexts)
    assert min(identity.info["turn_scores"]) >= 60
