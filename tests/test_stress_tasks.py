"""The stress benchmark's task samples: RULER samples sent under load, each response scored as
RULER scores it, the score under load set against the single-user answers (paired), goodput
(requests within the SLOs and answered correctly), the answers' lengths for the drift against
identity, the parameters refused at validate, and the report's tables and figure.

Scoring and goodput are checked on canned records; the pipeline against a fake server in this
process that reads the needle out of the prompt (and, told to, answers wrongly whenever it
serves two requests at once); and once against `kvbench serve` on the bundled model.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import textwrap
from dataclasses import dataclass, field

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")  # the server under test and its users' client

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure import load_figures as lf
from kvbench.benchmarks.measure import load_generator as lg
from kvbench.benchmarks.measure.load_generator import Prompt, RequestRecord, Task
from kvbench.benchmarks.measure.stress_requests import request_body
from kvbench.benchmarks.specs.server_target import parse_server
from kvbench.benchmarks.specs.stress import PREFIX_METRICS, TASK_METRICS, Stress, StressParams
from kvbench.config.fields import SettingError
from kvbench.methods import implementation
from kvbench.methods.settings.identity import Identity
from kvbench.models.info import describe_model
from tests.plugins.asgi import AppInThread
from tests.plugins.cli_support import invoke
from tests.plugins.model_runs import cpu_context
from tests.plugins.suites import line_of
from tests.test_stress import wide_console  # noqa: F401 - a fixture

NIAH = Task("niah_single_1", ("1234567",), "all", 128, "ctx\nquestion")


def rec(prompt=0, t_sent=0.0, t_first=0.5, t_end=1.5, tokens=5, text="", error="", user=0):
    r = RequestRecord(user=user, turn=0, prompt=prompt, t_sent=t_sent, t_first=t_first,
                      t_end=t_end, status=200 if not error else 500, error=error, text=text)
    r.output_tokens = tokens
    return r


# ---------------------------------------------------------------------------------------------
# scoring and goodput on canned records


def test_responses_are_scored_as_ruler_scores_them():
    assert lg.score_response(" 1234567.", NIAH) == 100.0
    assert lg.score_response(" The number is 7654321", NIAH) == 0.0
    assert lg.score_response("\x00 1234567\x1f", NIAH) == 100.0  # postprocessed first
    two = Task("niah_multivalue", ("11", "22"), "all", 128, "")
    assert lg.score_response("11 and 33", two) == 50.0  # string_match_all: the share found
    assert lg.score_response("11 and 33", Task("qa", ("11", "22"), "part", 32, "")) == 100.0
    prompts = [Prompt(0, "p0", [1], NIAH), Prompt(1, "p1", [2],
                                                   Task("t", ("abc",), "all", 8, "")),
               Prompt(2, "free text", [3])]
    records = [rec(0, text=" 1234567."), rec(1, text="ABC!"), rec(1, text="x"),
               rec(0, error="HTTP 500: boom", t_first=None), rec(2, text="anything")]
    lg.score_records(records, prompts)
    # a failed request and a free-text prompt have no score
    assert [r.score for r in records] == [100.0, 100.0, 0.0, None, None]


def test_generated_tokens_leave_out_end_of_sequence():
    r = rec()
    r.ids = [5, 6, 2]
    assert lg.generated_tokens(r, stop_ids={2}) == 2
    assert lg.generated_tokens(r, stop_ids=()) == 3
    r.ids = [2, 6]  # only a final end-of-sequence is the stop
    assert lg.generated_tokens(r, stop_ids={2}) == 2
    assert lg.generated_tokens(rec(error="x", t_first=None), stop_ids={2}) == 0


def test_slos_ttft_and_tpot_each_or_none():
    # TTFT 0.5 s; TPOT (1.5 - 0.5) / (5 - 1) = 0.25 s
    r = rec(t_sent=0.0, t_first=0.5, t_end=1.5, tokens=5)
    assert lf.meets_slos(r, 0.5, 0.25)  # at the limit meets it
    assert not lf.meets_slos(r, 0.4, None)
    assert not lf.meets_slos(r, None, 0.2)
    assert lf.meets_slos(r, None, None) and lf.meets_slos(r, 0, 0)  # no SLO at all
    one = rec(t_first=0.5, t_end=0.5, tokens=1)  # one token: no TPOT to miss
    assert lf.meets_slos(one, 1.0, 1e-9)
    assert not lf.meets_slos(rec(error="timeout", t_first=None), None, None)


def test_goodput_counts_requests_within_the_slos_and_answered_correctly():
    records = [
        rec(t_first=0.5, t_end=1.5, text="1234567"),  # in time, correct: good
        rec(t_first=3.0, t_end=4.0, text="1234567"),  # TTFT 3 s misses, correct
        rec(t_first=0.5, t_end=1.5, text="no"),  # in time, wrong
        rec(t_first=0.5, t_end=9.0, text="1234567"),  # TPOT 2.1 s misses, correct
        rec(error="HTTP 503: full", t_first=None),  # failed: neither
    ]
    lg.score_records(records, [Prompt(0, "p", [1], NIAH)])
    f = lf.goodput_figures(records, wall_s=10.0, slo_ttft_s=2.0, slo_tpot_s=1.0)
    assert f["goodput_rps"] == pytest.approx(1 / 10)
    assert f["slo_attainment"] == pytest.approx(2 / 5)  # of the planned requests
    assert f["correct_share"] == pytest.approx(3 / 5)
    # without SLOs every correct answer is good: goodput is the correct answers' rate
    f = lf.goodput_figures(records, wall_s=10.0, slo_ttft_s=None, slo_tpot_s=0)
    assert f["goodput_rps"] == pytest.approx(3 / 10) and f["slo_attainment"] == 4 / 5
    # a partial score is not correct
    partial = [rec(text="11")]
    lg.score_records(partial, [Prompt(0, "p", [1], Task("t", ("11", "22"), "all", 8, ""))])
    assert lf.goodput_figures(partial, 1.0, None, None)["goodput_rps"] == 0.0
    # free text: no scores, so neither goodput nor correctness; the SLOs still hold or not
    free = [rec(text="x")]
    lg.score_records(free, [Prompt(0, "p", [1])])
    f = lf.goodput_figures(free, 1.0, 2.0, 1.0)
    assert math.isnan(f["goodput_rps"]) and math.isnan(f["correct_share"])
    assert f["slo_attainment"] == 1.0


def test_a_task_sample_asks_its_own_length_and_ends_at_eos():
    params = StressParams(task="niah_single_1", max_tokens=7)
    prompt = Prompt(0, "<framed text>", [1, 2, 3], NIAH)
    body = request_body(params, parse_server("kvbench"), "m", prompt)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 128
    assert "ignore_eos" not in body and body["return_token_ids"] is True
    chat = request_body(StressParams(task="niah_single_1", api="chat"),
                        parse_server({"url": "http://127.0.0.1:1"}), None, prompt)
    assert chat["messages"] == [{"role": "user", "content": "ctx\nquestion"}]
    # the long-prompt user's free text at the same level keeps max_tokens and ignore_eos
    long = request_body(params, parse_server("kvbench"), "m", Prompt(-1, "t", [4]))
    assert long["max_tokens"] == 7 and long["ignore_eos"] is True


# ---------------------------------------------------------------------------------------------
# parameters refused at validate


def test_a_task_that_needs_qa_data_is_refused_naming_task():
    with pytest.raises(SettingError) as caught:
        StressParams(task="qa_1")
    assert caught.value.field == "task" and "squad" in str(caught.value)
    assert "niah_single_1" in str(caught.value)  # the tasks it can take
    with pytest.raises(SettingError, match="task must be none, niah_single_1"):
        StressParams(task="niah")


@pytest.mark.parametrize("field, value", [("slo_ttft_s", -1.0), ("slo_tpot_s", -0.5),
                                          ("task_length", 128), ("data_seed", 1.5)])
def test_bad_task_and_slo_settings_are_refused(field, value):
    with pytest.raises(SettingError) as caught:
        StressParams(task="niah_single_1", **{field: value})
    assert caught.value.field == field


def test_a_task_length_above_the_model_is_refused_naming_task_length():
    model = describe_model("bundled:smollm2-135m")
    Stress().check(StressParams(task="niah_single_1", task_length=4096), model)
    with pytest.raises(SettingError) as caught:
        Stress().check(StressParams(task="niah_single_1", task_length=model.max_context + 1),
                       model)
    assert caught.value.field == ("task_length",) and "task_length" in str(caught.value)
    # free text is held to prompt_tokens + max_tokens, not to task_length
    Stress().check(StressParams(task_length=model.max_context + 1), model)


def test_validate_names_the_file_line_and_key_of_a_bad_task(tmp_path, wide_console):
    suite = tmp_path / "stress.yaml"
    suite.write_text(textwrap.dedent("""\
        kvbench: 1
        name: stress-tasks-bad
        defaults: {model: "bundled:smollm2-135m", device: cpu}
        methods:
          - name: identity
        benchmarks:
          - kind: stress
            params:
              task: qa_2
            matrix: {users: [1, 2]}
          - kind: stress
            params:
              task: niah_single_1
              task_length: 100000
        """))
    result = invoke("validate", suite)
    assert result.exit_code == 2, result.output
    assert f"{suite}:{line_of(suite, 'task: qa_2')}: benchmarks[0].params.task: " in result.output
    assert "reads hotpotqa" in result.output
    assert (f"{suite}:{line_of(suite, 'task_length:')}: benchmarks[1].params.task_length: "
            in result.output)


# ---------------------------------------------------------------------------------------------
# the pipeline against a fake server that reads the needle


@dataclass
class Needle:
    """The fake's state: it answers with the magic number in the prompt, token by token (one
    character a chunk, then the end-of-sequence token's empty text); with `wrong_under_load`,
    a request served beside another answers 0000000."""

    wrong_under_load: bool = False
    in_flight: int = 0
    bodies: list[dict] = field(default_factory=list)


def needle_app(state: Needle):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def complete(request):
        body = await request.json()
        state.bodies.append(body)
        prompt = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
        found = re.search(r"is: (\d+)\.", prompt)

        async def stream():
            state.in_flight += 1
            try:
                await asyncio.sleep(0.05)  # the level's other users are in by now
                shared = state.in_flight > 1
                answer = found.group(1) if found else "none"
                if state.wrong_under_load and shared:
                    answer = "0" * len(answer)
                pieces = [" ", *answer, "."][:body["max_tokens"]]
                for piece in pieces:
                    await asyncio.sleep(0.002)
                    choice = {"index": 0, "text": piece, "finish_reason": None}
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                usage = {"prompt_tokens": 9, "completion_tokens": len(pieces),
                         "total_tokens": 9 + len(pieces)}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                state.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/health", health),
                             Route("/v1/completions", complete, methods=["POST"]),
                             Route("/v1/chat/completions", complete, methods=["POST"])])


def task_run(url: str, users: int, **params):
    ctx = cpu_context("tiny:llama")  # its byte tokenizer makes and frames the samples
    kept = []
    ctx.keep = kept.append
    p = StressParams(**{"users": users, "requests_per_user": 1, "prompts": 8,
                        "task": "niah_single_1", "task_length": 2048, "server": {"url": url},
                        **params})
    try:
        out = measurement(Stress).run(p, implementation(Identity()), ctx)
    finally:
        ctx.memo.close()
    return out, kept


def values(out) -> dict[str, float]:
    return {name: metric.value for name, metric in out.metrics.items()}


def test_task_samples_are_scored_under_load_and_alone():
    with AppInThread(needle_app(Needle())) as server:
        out, kept = task_run(server.url, users=4, requests_per_user=2)
    m = values(out)
    # every metric, the task's included, but the long-prompt user's TTFT (none was sent)
    assert list(out.metrics) == [m for m in Stress.metrics
                                 if m != "long_prompt_ttft_s" and m not in PREFIX_METRICS]
    assert m["errors"] == 0 and m["requests"] == 8
    assert m["score"] == m["score_alone"] == 100.0 and m["score_vs_alone"] == 0.0
    assert (m["score_ci_low"], m["score_ci_high"]) == pytest.approx((67.56, 100.0), abs=0.01)
    assert m["correct_share"] == 1.0 and m["slo_attainment"] == 1.0
    assert m["goodput_rps"] == pytest.approx(m["request_throughput"])
    # " 1234567." is 9 tokens of the byte tokenizer, under load as alone
    assert m["answer_tokens"] == m["answer_tokens_alone"] == 9
    paired = out.info["paired"]
    assert paired["verdict"] == "not separated" and paired["p_value"] == 1.0
    assert (paired["wins"], paired["losses"]) == (0, 0)
    assert sorted(p for p, _, _ in paired["pairs"]) == [0, 1, 2, 3, 4, 5, 6, 7]
    # per prompt, in prompt order, from the single-user pass
    info = out.info
    assert info["scores_alone"] == [100.0] * 8 and info["generated"] == [9] * 8
    assert len(info["answer_s"]) == 8 and all(s > 0 for s in info["answer_s"])
    assert len(set(info["prompt_sha256s"])) == 8 and info["metric"] == "string_match_all"
    assert info["task"] == "niah_single_1" and info["tokens_to_generate"] == 128
    singles = [k for k in kept if k.get("pass") == "single user"]
    assert [k["prompt"] for k in singles] == list(range(8)) and singles[0]["score"] == 100.0


def test_the_samples_are_ruler_samples_asking_their_tasks_length():
    state = Needle()
    with AppInThread(needle_app(state)) as server:
        out, _ = task_run(server.url, users=2)
    from kvbench.data.ruler import make_sample
    from kvbench.models.loading import load_tokenizer

    tokenizer = load_tokenizer("tiny:llama")
    # the ruler benchmark's sample 3 (data_seed 0, 2048 tokens of the byte tokenizer, no chat
    # template: the task's text as it is) is what prompt 3 sent
    sample = make_sample("niah_single_1", 3, length=2048, seed=0,
                         count_tokens=lambda s: len(tokenizer.encode(
                             s.context + s.question + s.answer_prefix)))
    sent = [b["prompt"] for b in state.bodies]
    assert any(sample.references[0] in text and sample.context in text for text in sent)
    assert all(b["max_tokens"] == 128 and "ignore_eos" not in b for b in state.bodies)
    assert out.metrics["score"].value == 100.0


def test_answers_wrong_under_load_are_worse_than_alone_and_not_goodput():
    with AppInThread(needle_app(Needle(wrong_under_load=True))) as server:
        out, kept = task_run(server.url, users=8)
    m = values(out)
    assert m["errors"] == 0 and m["score_alone"] == 100.0 and m["score"] == 0.0
    assert m["score_vs_alone"] == -100.0
    assert m["correct_share"] == 0.0 and m["goodput_rps"] == 0.0
    assert m["request_throughput"] > 0
    paired = out.info["paired"]
    assert paired["verdict"] == "worse" and paired["losses"] == 8
    assert paired["p_value"] == pytest.approx(2 / 2 ** 8)
    # the kept differing responses carry both scores
    differing = [k for k in kept if "score_alone" in k]
    assert len(differing) == 8 and all(k["score"] == 0.0 for k in differing)


def test_slos_no_request_meets_give_zero_goodput():
    with AppInThread(needle_app(Needle())) as server:
        out, _ = task_run(server.url, users=2, slo_ttft_s=1e-6)
    m = values(out)
    assert m["slo_attainment"] == 0.0 and m["goodput_rps"] == 0.0 and m["correct_share"] == 1.0


# ---------------------------------------------------------------------------------------------
# against kvbench serve on the bundled model


@pytest.mark.model
def test_identity_under_load_answers_as_alone_through_kvbench_serve(tmp_path):
    ctx = cpu_context("bundled:smollm2-135m")
    ctx.files_dir = tmp_path
    params = StressParams(users=2, requests_per_user=2, prompts=4, task="niah_single_1",
                          task_length=512, request_timeout_s=600, level_timeout_s=1200)
    try:
        out = measurement(Stress).run(params, implementation(Identity()), ctx)
    finally:
        ctx.memo.close()
    m = values(out)
    assert m["errors"] == 0 and m["requests"] == 4, out.info.get("failures")
    info = out.info
    assert len(info["scores_alone"]) == len(info["generated"]) == len(info["prompt_sha256s"]) == 4
    assert len(info["answer_s"]) == 4
    # identity under load answers each prompt as it did alone: the same score, pair by pair
    pairs = info["paired"]["pairs"]
    assert len(pairs) == 4 and all(under == alone for _, under, alone in pairs)
    assert info["paired"]["verdict"] == "not separated" and m["score_vs_alone"] == 0.0
    assert m["score"] == m["score_alone"] and m["token_agreement"] == 1.0
    assert m["answer_tokens"] == m["answer_tokens_alone"]
    # answers end at end-of-sequence, long before the task's 128 tokens
    assert 0 < max(info["generated"]) < 128
    assert m["goodput_rps"] <= m["request_throughput"]
    assert 0 <= m["slo_attainment"] <= 1 and 0 <= m["correct_share"] <= 1


# ---------------------------------------------------------------------------------------------
# the report, from a hand-made results object


def _metric(value, unit="", direction="none"):
    from kvbench.results import Metric

    return Metric(value=value, unit=unit, direction=direction)


def task_case(label: str, users: int, score: float, goodput: float, verdict="not separated",
              kv_budget: int = 0, generated=(9, 9, 9, 9), method: str | None = None,
              held: int | None = None):
    from kvbench.results import CaseResult

    values = {"output_tok_s": 10.0 * users, "per_user_tok_s": 10.0, "aggregate_vs_single": 1.0,
              "ttft_s_p99": 0.1 * users, "chunk_gap_s_p99": 0.01, "e2e_s_p99": 1.0,
              "errors": 0, "token_agreement": 1.0, "responses_differing": 0,
              "responses_flagged": 0, "sessions_held": held or users,
              "request_throughput": 0.5 * users, "score": score, "score_ci_low": score - 20,
              "score_ci_high": min(100.0, score + 10), "score_alone": 100.0,
              "score_vs_alone": score - 100.0, "goodput_rps": goodput,
              "slo_attainment": 0.75, "correct_share": score / 100,
              "answer_tokens": 9.5, "answer_tokens_alone": 9.0}
    params = {"users": users, "requests_per_user": 2, "prompts": 4, "prompt_tokens": 64,
              "max_tokens": 32, "text": "pydoc", "offset": 0, "task": "niah_single_1",
              "task_length": 512, "data_seed": 0, "essay": "pydoc", "api": "completions",
              "server": "kvbench", "kv_budget": kv_budget, "request_timeout_s": 120.0,
              "level_timeout_s": 900.0, "slo_ttft_s": 10.0, "slo_tpot_s": 0.5,
              "tie_margin": 0.05, "ignore_eos": True}
    return CaseResult(
        id=f"stress/{label}/users={users}", benchmark="stress", bench_params=params,
        method=method or label, method_label=label, method_params={}, model="m", status="ok",
        metrics={k: _metric(v) for k, v in values.items()},
        info={"paired": {"pairs": [], "wins": 0, "losses": 8 if verdict == "worse" else 0,
                         "p_value": 0.0078 if verdict == "worse" else 1.0,
                         "mean_difference": score - 100.0, "low": score - 100.0 - 5,
                         "high": min(0.0, score - 100.0 + 5), "verdict": verdict},
              "scores_alone": [100.0] * 4, "generated": list(generated),
              "answer_s": [1.0 + g / 100 for g in generated],
              "prompt_sha256s": ["a", "b", "c", "d"]},
        comparable={"prompts_sha256": "x"})


@pytest.fixture
def task_result():
    from tests.test_report_retrieval import run

    return run([task_case("identity", 1, 100.0, 0.5), task_case("identity", 4, 100.0, 1.5),
                task_case("snapkv", 1, 100.0, 0.5, generated=(9, 12, 14, 20)),
                task_case("snapkv", 4, 50.0, 0.25, verdict="worse",
                          generated=(9, 12, 14, 20)),
                task_case("identity", 16, 100.0, 0.8, kv_budget=50_000_000, held=3),
                task_case("snapkv", 16, 75.0, 2.0, kv_budget=50_000_000, held=12,
                          generated=(9, 12, 14, 20))])


def test_the_report_has_the_accuracy_table_per_method(task_result):
    from kvbench.report.markdown import render_markdown
    from tests.test_report_retrieval import _row

    text = render_markdown(task_result)
    assert "### Accuracy under load and goodput" in text
    assert "SLOs: TTFT ≤ 10 s, TPOT ≤ 0.5 s" in text and "`niah_single_1`" in text
    accuracy = text[text.index("### Accuracy under load and goodput"):]
    snapkv = accuracy[accuracy.index("**snapkv (kv_budget=0)**"):]
    assert _row(snapkv, "4") == ["4", "50.0 [30.0, 60.0]", "100.0", "−50.0 [−55.0, −45.0]",
                                 "worse (p 0.008)", "0.250", "2.000", "0.75", "0.50",
                                 "9.5 / 9.0", "0"]
    identity = accuracy[accuracy.index("**identity (kv_budget=0)**"):]
    assert _row(identity, "1")[1:5] == ["100.0 [80.0, 100.0]", "100.0", "±0.0 [−5.0, ±0.0]",
                                        "not separated (p 1.000)"]
    assert "**snapkv (kv_budget=0)** at 4 users: the score under load is below" in text
    # free-text settings that mean nothing with a task are not stated for all lines
    common = next(line for line in text.splitlines() if "all lines:" in line)
    assert "all lines: requests_per_user=2 · prompts=4 · task=niah_single_1 ·" in common
    assert "prompt_tokens" not in common and "max_tokens" not in common


def test_the_capacity_table_shows_accuracy_at_the_same_memory(task_result):
    from kvbench.benchmarks.reports.stress import capacity_section
    from kvbench.benchmarks.reports.stress_table import stress_table
    from tests.test_report_retrieval import _row

    text = capacity_section(stress_table(task_result))
    assert text.startswith("### Capacity at the same KV budget")
    assert _row(text, "snapkv") == ["snapkv", "47.68 MiB", "16", "12", "160.0", "8.000", "0",
                                    "75.0 [55.0, 85.0]", "2.000", "0.75"]
    assert _row(text, "identity")[3] == "3"
    assert "| snapkv (kv_budget=0)" not in text  # the levels without a budget are not in it


def test_free_text_cases_get_neither_accuracy_nor_capacity_tables():
    from kvbench.report.markdown import render_markdown
    from tests.test_report_retrieval import run
    from tests.test_stress import stress_case

    text = render_markdown(run([stress_case("identity", 1, 10.0),
                                stress_case("identity", 4, 30.0)]))
    assert "### Concurrent users" in text
    assert "Accuracy under load" not in text and "Capacity at the same" not in text
    assert "output length" not in text


def test_the_length_drift_pairs_each_method_once_with_identity(task_result):
    from kvbench.benchmarks.reports.stress import drift_section

    text = drift_section(task_result)
    assert text.startswith("### stress: output length")
    row = next(line for line in text.splitlines() if line.startswith("| snapkv |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # one case per method and setting: the levels share their server's single-user pass, so
    # 4 pairs (not 4 per level); snapkv's answers 9, 12, 14, 20 against identity's 9s
    assert cells[1] == "niah_single_1" and cells[2] == "4"
    assert cells[3:5] == ["9.0", "13.8"]
    assert cells[6] == "3 / 0"


def test_the_goodput_figure_draws_one_line_per_method(task_result, tmp_path):
    pytest.importorskip("matplotlib")
    from kvbench.benchmarks.reports import stress_figures
    from kvbench.benchmarks.reports.stress_table import stress_table
    from kvbench.report.markdown import write_reports
    from tests.test_report_retrieval import PNG_MAGIC

    report = write_reports(task_result, tmp_path).read_text()
    assert (tmp_path / stress_figures.GOODPUT_PNG).read_bytes()[:8] == PNG_MAGIC
    assert f"]({stress_figures.GOODPUT_PNG})" in report
    plot = stress_figures.stress_goodput_png(stress_table(task_result), tmp_path / "g.png",
                                             "t").plot
    # the kv_budget levels are one level per line: no curve
    assert plot["goodput_rps"] == {"identity (kv_budget=0)": ([1, 4], [0.5, 1.5]),
                                   "snapkv (kv_budget=0)": ([1, 4], [0.5, 0.25])}
    assert plot["request_throughput"]["snapkv (kv_budget=0)"] == ([1, 4], [0.5, 2.0])


def test_free_text_records_no_task_metrics():
    assert set(TASK_METRICS) <= set(Stress.metrics)
    assert "slo_attainment" not in TASK_METRICS and "answer_tokens" not in TASK_METRICS
