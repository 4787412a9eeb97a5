"""The stress benchmark (client side): the arithmetic on request records, the load loop against a
fake OpenAI-style server in this process (failures, stalls, a cache that leaks under load),
loopback-only urls, managed servers (a real third-party one: mlx_lm.server), and the report.

The fake server streams one token per chunk. A prompt's answer is fixed by its text; with
`leak` set, a request that has shared the server with another gets other tokens from position
`leak_at` on, as a cache shared between sessions would give it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import socket
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")  # the server under test and its users' client

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure import load_figures as lf
from kvbench.benchmarks.measure import load_generator as lg
from kvbench.benchmarks.measure.load_generator import Prompt, Reference, RequestRecord
from kvbench.benchmarks.measure.kvbench_serve import import_root, method_name
from kvbench.benchmarks.measure.servers import (
    POOL_MEMO_KEY, ExternalServer, ManagedServer, RunningServer, ServerError, ServerPool,
    free_port,
)
from kvbench.benchmarks.measure.stress_requests import (
    make_prompts, request_body,
)
from kvbench.benchmarks.specs.server_target import check_server_url, parse_server
from kvbench.benchmarks.specs.stress import PREFIX_METRICS, TASK_METRICS, Stress, StressParams
from kvbench.methods import implementation
from kvbench.methods.settings.identity import Identity
from tests.plugins.asgi import AppInThread
from tests.plugins.cli_support import invoke
from tests.plugins.model_runs import cpu_context
from tests.plugins.suites import ROOT, line_of

# ---------------------------------------------------------------------------------------------
# the fake server


@dataclass
class Fake:
    token_s: float = 0.005  # between tokens
    stall_s: float = 0.0  # before the first token
    leak: bool = False
    leak_at: int = 2
    margin: float = 3.0  # top-1 minus top-2 logprob at every position ...
    tie_at: int | None = None  # ... but this one, where it is `tie`
    tie: float = 0.01
    in_flight: int = 0
    most_in_flight: int = 0
    requests: int = 0


def answer_ids(prompt: str, n: int) -> list[int]:
    base = int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % 100
    return [10 + (base + 7 * i) % 200 for i in range(n)]


def fake_app(fake: Fake):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def complete(request):
        body = await request.json()
        prompt = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        fake.requests += 1
        if "FAIL" in prompt:
            return JSONResponse({"error": "deliberate failure"}, status_code=500)
        chat = "messages" in body

        async def stream():
            fake.in_flight += 1
            fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
            try:
                await asyncio.sleep(fake.stall_s)
                ids = [] if "EMPTY" in prompt else answer_ids(prompt, body["max_tokens"])
                shared = False  # another request was in flight beside this one
                for i, token in enumerate(ids):
                    await asyncio.sleep(fake.token_s)
                    shared = shared or fake.in_flight > 1
                    if fake.leak and shared and i >= fake.leak_at:
                        token += 1
                    margin = fake.tie if i == fake.tie_at else fake.margin
                    text = f"<{token}>"
                    choice = {"index": 0, "token_ids": [token],
                              "finish_reason": "length" if i == len(ids) - 1 else None}
                    if chat:
                        choice["delta"] = {"content": text}
                    else:
                        choice["text"] = text
                    if body.get("logprobs"):
                        choice["logprobs"] = {"tokens": [text], "token_logprobs": [-0.1],
                                              "top_logprobs": [{text: -0.1,
                                                                "<x>": -0.1 - margin}]}
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                usage = {"prompt_tokens": 3, "completion_tokens": len(ids),
                         "total_tokens": 3 + len(ids)}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                fake.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/health", health),
                             Route("/v1/completions", complete, methods=["POST"]),
                             Route("/v1/chat/completions", complete, methods=["POST"])])


class FakeServer(AppInThread):
    """The fake app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, fake: Fake):
        super().__init__(fake_app(fake))
        self.fake = fake


def serve_fake(port: int) -> None:
    """The fake server as a process of its own (a managed `command` in the suite test)."""
    import uvicorn

    uvicorn.run(fake_app(Fake()), host="127.0.0.1", port=port, log_level="info",
                lifespan="off")


@pytest.fixture
def fake():
    with FakeServer(Fake()) as server:
        yield server


def prompts(*texts: str) -> list[Prompt]:
    return [Prompt(i, text, [4 + i]) for i, text in enumerate(texts)]


def body(prompt: Prompt) -> dict:
    return {"prompt": prompt.text, "max_tokens": 4, "temperature": 0, "stream": True,
            "logprobs": 2}


class Bytes:
    """A tokenizer for records without server token ids: one token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


# ---------------------------------------------------------------------------------------------
# arithmetic on synthetic records


def rec(user, t_sent, t_first, t_end, tokens, chunks=(), error="", prompt=0, turn=0):
    r = RequestRecord(user=user, turn=turn, prompt=prompt, t_sent=t_sent, t_first=t_first,
                      t_end=t_end, status=200 if not error else 500, error=error,
                      chunk_times=list(chunks))
    r.output_tokens = tokens
    return r


def test_level_figures_count_only_successes_in_tokens_and_latencies():
    records = [
        # user 0: two requests back to back, 5 tokens each
        rec(0, 0.0, 0.5, 2.5, 5, chunks=[0.5, 1.0, 1.5, 2.0, 2.5]),
        rec(0, 2.5, 2.7, 4.0, 5, chunks=[2.7, 3.0, 3.4, 3.7, 4.0], turn=1),
        # user 1: one success of 3 tokens, then a failure that must not enter any latency
        rec(1, 0.0, 1.0, 2.0, 3, chunks=[1.0, 1.5, 2.0]),
        rec(1, 2.0, None, 5.0, 0, error="HTTP 500: boom", turn=1),
    ]
    f = lf.level_figures(records, users=2)
    assert f["wall_s"] == 5.0  # first sent 0.0, last finished 5.0 (the failure included)
    assert f["output_tokens"] == 13
    assert f["output_tok_s"] == pytest.approx(13 / 5)
    assert f["request_throughput"] == pytest.approx(3 / 5)
    assert f["errors"] == 1 and f["requests"] == 4
    # user 0: 10 tokens over 4 s busy; user 1: 3 tokens over 5 s (its failure kept it busy)
    assert f["per_user_tok_s"] == pytest.approx((10 / 4 + 3 / 5) / 2)
    # TTFT of the successes: 0.5, 0.2, 1.0 -> p50 0.5; linear p90 between 0.5 and 1.0
    assert f["ttft_s_p50"] == pytest.approx(0.5)
    assert f["ttft_s_p90"] == pytest.approx(0.5 + 0.8 * 0.5)
    # TPOT: (2.5-0.5)/4 = 0.5, (4.0-2.7)/4 = 0.325, (2.0-1.0)/2 = 0.5
    assert f["tpot_s_p50"] == pytest.approx(0.5)
    assert lf.time_per_output_token(records[1]) == pytest.approx(0.325)
    # e2e: 2.5, 1.5, 2.0 (the failure's 3.0 is not there)
    assert f["e2e_s_p50"] == pytest.approx(2.0)
    assert f["e2e_s_p99"] == pytest.approx(2.0 + 0.98 * 0.5)
    # chunk gaps pooled: 0.5 x4, 0.3, 0.4, 0.3, 0.3, 0.5, 0.5 -> median 0.5
    assert f["chunk_gap_s_p50"] == pytest.approx(0.5)
    assert f["chunk_gap_s_max"] == pytest.approx(0.5)
    assert f["sessions_held"] == 2


def test_the_largest_chunk_gap_shows_a_stall_the_p99_hides():
    """A long prefill in one forward stalls every stream once: 4 gaps of 70 s among 500 of
    0.3 s are under the p99, and are the largest gap."""
    records = [rec(u, 0.0, 0.1, 200.0, 126,
                   chunks=[0.1 + 0.3 * i + (70.0 if i >= 60 else 0.0) for i in range(126)])
               for u in range(4)]
    f = lf.level_figures(records, users=4)
    assert f["chunk_gap_s_p99"] == pytest.approx(0.3)
    assert f["chunk_gap_s_max"] == pytest.approx(70.3)


def test_no_success_gives_nan_latencies_and_zero_throughput():
    records = [rec(0, 0.0, None, 1.0, 0, error="timeout: ..."),
               rec(1, 0.0, None, 2.0, 0, error="HTTP 503: busy")]
    f = lf.level_figures(records, users=2)
    for name in ("ttft_s_p50", "tpot_s_p99", "chunk_gap_s_p90", "chunk_gap_s_max", "e2e_s_p99"):
        assert math.isnan(f[name])
    assert f["output_tok_s"] == 0 and f["errors"] == 2 and f["sessions_held"] == 0


def test_tpot_needs_two_tokens_and_percentiles_of_nothing_are_nan():
    assert lf.time_per_output_token(rec(0, 0, 1, 3, 1)) is None
    assert lf.time_per_output_token(rec(0, 0, 1, 3, 3)) == pytest.approx(1.0)
    assert all(math.isnan(v) for v in lf.percentiles([]).values())
    assert lf.percentiles([1.0, 2.0, 3.0, 4.0]) == {50: 2.5, 90: pytest.approx(3.7),
                                                    99: pytest.approx(3.97)}


def test_sessions_held_is_the_most_streaming_at_once():
    records = [
        rec(0, 0, 1.0, 4.0, 2), rec(1, 0, 2.0, 3.0, 2), rec(2, 0, 2.5, 5.0, 2),  # 3 at 2.5
        rec(3, 0, 5.0, 6.0, 2),  # starts as user 2 ends: not an overlap
        rec(4, 0, 2.6, 2.9, 0, error="HTTP 500"),  # a failure holds nothing
    ]
    records[4].t_first = 2.6
    assert lf.sessions_held(records) == 3
    assert lf.sessions_held(records[3:]) == 1


def test_tokens_come_from_usage_then_token_ids_then_the_tokenizer():
    a = rec(0, 0, 1, 2, 0)
    a.text, a.usage_tokens, a.server_ids = "abc", 7, [1, 2, 3]
    b = rec(0, 0, 1, 2, 0)
    b.text, b.server_ids = "abcd", [5, 6]
    c = rec(0, 0, 1, 2, 0)
    c.text = "xyz!"
    failed = rec(0, 0, None, 2, 0, error="boom")
    failed.text = "never counted"
    lg.count_tokens([a, b, c, failed], Bytes())
    assert (a.output_tokens, a.count_source, a.ids, a.ids_source) == (7, "usage", [1, 2, 3],
                                                                      "token_ids")
    assert (b.output_tokens, b.count_source, b.ids) == (2, "token_ids", [5, 6])
    assert (c.output_tokens, c.count_source, c.ids_source) == (4, "tokenizer", "tokenizer")
    assert c.ids == [ord(ch) for ch in "xyz!"]
    assert failed.output_tokens == 0 and failed.ids == []


def _tops(*pairs):
    """Listed candidates per position from (top-1 text, its logprob, top-2 text, its logprob)."""
    return [None if p is None else {p[0]: p[1], p[2]: p[3]} for p in pairs]


def test_agreement_first_difference_and_flagging():
    ref = Reference(ids=[1, 2, 3, 4], text="",
                    tops=_tops(("a", -0.1, "b", -5.1), ("c", -0.69, "d", -0.70),
                               ("e", -0.3, "f", -1.5), None))
    same = lg.compare([1, 2, 3, 4], ref, tie_margin=0.05, shift_nats=1.0)
    assert (same.agreement, same.identical, same.flagged) == (1.0, True, False)
    tie = lg.compare([1, 9, 9, 9], ref, 0.05, 1.0)  # flips where the answer was a near-tie
    assert (tie.agreement, tie.first_difference, tie.kind, tie.flagged) == (0.25, 1, "near-tie",
                                                                           False)
    assert tie.margin == pytest.approx(0.01)
    confident = lg.compare([1, 2, 8, 4], ref, 0.05, 1.0)  # flips where it was sure, no logprobs
    assert (confident.agreement, confident.first_difference, confident.flagged) == (0.5, 2, True)
    # the same flip where the response saw the same candidates, moved by under a nat: noise
    moved = lg.compare([1, 2, 8, 4], ref, 0.05, 1.0, _tops(None, None, ("f", -0.8, "e", -0.9)))
    assert (moved.kind, moved.flagged) == ("perturbed", False)
    assert lg.compare([1, 2, 8, 4], ref, 0.05, 0.65,  # the same, with a stricter bound
                      _tops(None, None, ("f", -0.8, "e", -0.9))).flagged
    # another context's candidates: the answer's token is not among them
    other = lg.compare([1, 2, 8, 4], ref, 0.05, 1.0, _tops(None, None, ("x", -0.5, "y", -0.9)))
    assert (other.kind, other.flagged) == ("beyond noise", True)
    # its own token is not among the answer's candidates
    assert lg.compare([1, 2, 8, 4], ref, 0.05, 9.0,
                      _tops(None, None, ("x", -0.5, "e", -0.9))).flagged
    assert lg.compare([1, 2, 3, 7], ref, 0.05, 1.0).flagged  # margin unknown there
    assert lg.compare([1, 2, 3, 4, 5], ref, 0.05, 1.0).flagged  # longer: past the answer's end
    assert lg.compare([1, 9], ref, tie_margin=0.001, shift_nats=1.0).flagged  # stricter margin
    blind = Reference(ids=[1, 2, 3, 4], text="", tops=None)  # no logprobs: every difference
    assert lg.compare([1, 9, 3, 4], blind, 0.05, 1.0).flagged
    assert not lg.compare([1, 2, 3, 4], blind, 0.05, 1.0).flagged
    with pytest.raises(ValueError, match="no tokens"):
        lg.compare([1], Reference([], "", None), 0.05, 1.0)


def test_logprob_tops_read_both_openai_shapes():
    completions = {"top_logprobs": [{"a": -0.1, "b": -2.1}, {"a": -0.5}, None]}
    tops = lg.logprob_tops(completions)
    assert tops == [{"a": -0.1, "b": -2.1}, {"a": -0.5}, {}]
    assert [lg.margin(t) for t in tops] == [pytest.approx(2.0), None, None]
    chat = {"content": [{"token": "a", "logprob": -0.2,
                         "top_logprobs": [{"token": "b", "logprob": -1.7},
                                          {"token": "a", "logprob": -0.2}]}]}
    assert lg.logprob_tops(chat) == [{"b": -1.7, "a": -0.2}]
    assert lg.margin(lg.logprob_tops(chat)[0]) == pytest.approx(1.5)
    assert lg.logprob_tops(None) is None and lg.logprob_tops({"x": 1}) is None


def test_chunks_without_text_or_ids_are_not_tokens():
    r = RequestRecord(0, 0, 0, t_sent=0.0)
    lg.take_chunk(r, {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, 0.1)
    assert r.t_first is None and not r.chunk_times
    lg.take_chunk(r, {"choices": [{"index": 0, "delta": {"content": "hi"}}]}, 0.2)
    lg.take_chunk(r, {"choices": [], "usage": {"completion_tokens": 1}}, 0.3)
    assert (r.t_first, r.chunk_times, r.text, r.usage_tokens) == (0.2, [0.2], "hi", 1)
    lg.take_chunk(r, {"error": {"message": "overloaded"}}, 0.4)
    assert "overloaded" in r.error


# ---------------------------------------------------------------------------------------------
# loopback only, server shapes


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:{port}/",
                                 "http://[::1]:9000", "https://127.0.0.1"])
def test_loopback_urls_are_accepted(url):
    check_server_url(url)


@pytest.mark.parametrize("url, words", [
    ("http://10.0.0.1:8000", "'10.0.0.1' is not loopback"),
    ("http://127.0.0.1.example.com:80", "is not loopback"),
    ("http://127.0.0.1@example.com", "'example.com' is not loopback"),
    ("http://0.0.0.0:8000", "is not loopback"),
    ("ftp://127.0.0.1", "must start with http://"),
    ("127.0.0.1:8000", "must start with http://"),
])
def test_other_hosts_are_refused_everywhere(url, words):
    with pytest.raises(ValueError, match=words):
        check_server_url(url)
    with pytest.raises(ValueError, match=words):
        StressParams(server={"url": url})
    with pytest.raises(ValueError, match="not loopback|http://"):
        lg.run_level(url, "/v1/completions", prompts("a"), 1, 1, body, 1, 1)


def test_a_server_on_another_machine_is_reached_only_where_the_target_says_remote():
    url = "http://10.0.0.7:8000"
    target = StressParams(server={"url": url, "remote": True}).target
    assert (target.kind, target.url, target.remote) == ("url", url, True)
    assert ExternalServer(url, "theirs", remote=True).url == url
    check_server_url(url, remote=True)
    with pytest.raises(ValueError, match="remote: true"):
        StressParams(server={"url": url})
    with pytest.raises(ValueError, match="not loopback"):
        ExternalServer(url, "theirs")


@pytest.mark.parametrize("server, words", [
    ("vllm", "server must be 'kvbench'"),
    ({"command": ["x"]}, "server needs a url"),
    ({"url": "http://127.0.0.1:{port}"}, "no command"),
    ({"url": "http://127.0.0.1:1", "command": []}, "non-empty list of strings"),
    ({"url": "http://127.0.0.1:1", "comand": ["x"]}, "unknown key 'comand'"),
    ({"url": "http://127.0.0.1:1", "logprobs": "yes"}, "logprobs must be true or false"),
    ({"url": "http://127.0.0.1:1", "remote": "yes"}, "remote must be true or false"),
    ({"url": "http://10.0.0.7:{port}", "command": ["s"], "remote": True},
     "a server kvbench starts listens on loopback"),
])
def test_bad_server_settings_are_refused(server, words):
    with pytest.raises(ValueError, match=words):
        StressParams(server=server)


def test_kv_budget_needs_a_kvbench_server_and_ranges_are_checked():
    with pytest.raises(ValueError, match="kv_budget .* needs server: kvbench"):
        StressParams(kv_budget=1 << 20, server={"url": "http://127.0.0.1:8000"})
    assert StressParams(kv_budget=1 << 20).kv_budget == 1 << 20
    with pytest.raises(ValueError, match="users must be >= 1"):
        StressParams(users=0)
    with pytest.raises(ValueError, match="level_timeout_s must be > 0"):
        StressParams(level_timeout_s=0)
    target = parse_server({"command": ["s", "--port", "{port}"], "url": "http://127.0.0.1:{port}",
                           "model": "m"})
    assert (target.kind, target.command, target.model) == ("command", ("s", "--port", "{port}"),
                                                           "m")


@pytest.fixture
def wide_console():
    """rich wraps at 80 columns without a terminal: keep file:line and the key on one line."""
    from kvbench.cli import common

    saved = common.err._width, common.console._width
    common.err.width = common.console.width = 1000
    yield
    common.err._width, common.console._width = saved


def test_validate_refuses_a_non_loopback_url_with_file_and_line(tmp_path, wide_console):
    suite = tmp_path / "stress.yaml"
    suite.write_text(textwrap.dedent("""\
        kvbench: 1
        name: stress-remote
        defaults: {model: "tiny:llama", device: cpu}
        methods:
          - name: identity
        benchmarks:
          - kind: stress
            params:
              max_tokens: 4
              server: {url: "http://192.168.1.5:8000"}
            matrix: {users: [1, 2]}
        """))
    result = invoke("validate", suite)
    assert result.exit_code == 2, result.output
    assert f"{suite}:{line_of(suite, 'server:')}: benchmarks[0].params.server: " in result.output
    assert "'192.168.1.5' is not loopback" in result.output
    assert "valid:" not in result.output


def test_method_names_sent_to_kvbench_serve():
    from tests.plugins.kvb_testplugin import SharedCache

    assert method_name(Identity()) == "identity"
    # a subclass of a registered method is not that method: it goes as module:Class, and the
    # server is told where that module was imported from
    assert method_name(SharedCache()) == "tests.plugins.kvb_testplugin:SharedCache"
    assert import_root(SharedCache) == str(ROOT) and import_root(Identity) is None


def test_request_bodies_send_extensions_to_kvbench_servers_only():
    prompt = Prompt(0, "some text", [5, 6, 7])
    kvbench = request_body(StressParams(max_tokens=5), parse_server("kvbench"), "tiny:llama",
                           prompt)
    assert kvbench == {"max_tokens": 5, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "model": "tiny:llama",
                       "prompt": [5, 6, 7], "logprobs": 5, "return_token_ids": True,
                       "ignore_eos": True}
    other = parse_server({"url": "http://127.0.0.1:8000"})
    plain = request_body(StressParams(max_tokens=5), other, None, prompt)
    assert plain == {"max_tokens": 5, "temperature": 0, "stream": True,
                     "stream_options": {"include_usage": True}, "prompt": "some text"}
    asked = parse_server({"url": "http://127.0.0.1:8000", "logprobs": True, "model": "m"})
    chat = request_body(StressParams(api="chat"), asked, asked.model, prompt)
    assert chat["messages"] == [{"role": "user", "content": "some text"}]
    assert (chat["model"], chat["logprobs"], chat["top_logprobs"]) == ("m", True, 5)
    assert "ignore_eos" not in chat and "return_token_ids" not in chat


def test_prompts_are_distinct_seeded_windows(tmp_path):
    from kvbench.memo import Memo
    from kvbench.models.tiny import ByteTokenizer

    text = tmp_path / "t.txt"
    text.write_text("".join(chr(ord("a") + i % 26) for i in range(200)))
    params = StressParams(prompts=5, prompt_tokens=10, offset=50, text=str(text))
    one = make_prompts(Memo(), ByteTokenizer(), "tiny:llama", params, seed=0)
    again = make_prompts(Memo(), ByteTokenizer(), "tiny:llama", params, seed=0)
    other = make_prompts(Memo(), ByteTokenizer(), "tiny:llama", params, seed=1)
    assert [p.ids for p in one] == [p.ids for p in again] != [p.ids for p in other]
    assert len({tuple(p.ids) for p in one}) == 5 and all(len(p.ids) == 10 for p in one)
    assert all(p.ids[0] - 4 >= ord("a") for p in one) and [p.index for p in one] == [0, 1, 2,
                                                                                       3, 4]
    assert one[0].text == ByteTokenizer().decode(one[0].ids)
    starts = {chr(p.ids[0] - 4) for p in one}  # drawn from offset 50 on: not all at "y"
    assert len(starts) > 1
    with pytest.raises(ValueError, match="too few for 5 distinct windows of 10 tokens"):
        make_prompts(Memo(), ByteTokenizer(), "tiny:llama",
                     StressParams(prompts=5, prompt_tokens=10, offset=188, text=str(text)), 0)


# ---------------------------------------------------------------------------------------------
# the load loop against the fake server


def test_failures_are_counted_and_kept_out_of_the_latencies(fake):
    level = lg.run_level(fake.url, "/v1/completions", prompts("ok one", "FAIL two", "EMPTY"),
                         users=3, requests_per_user=2, body=body, request_timeout_s=10,
                         level_timeout_s=30)
    lg.count_tokens(level.records, Bytes())
    by_prompt = {}
    for r in level.records:
        by_prompt.setdefault(r.prompt, []).append(r)
    # user u's j-th request asks prompt (2u + j) % 3: each prompt twice
    assert [len(by_prompt[p]) for p in range(3)] == [2, 2, 2]
    assert all(r.ok and r.output_tokens == 4 and r.ids == answer_ids("ok one", 4)
               for r in by_prompt[0])
    assert all(r.status == 500 and r.error.startswith("HTTP 500") for r in by_prompt[1])
    assert all(r.status == 200 and r.error == "the stream ended with no token"
               for r in by_prompt[2])
    f = lf.level_figures(level.records, 3)
    assert (f["errors"], f["requests"], f["output_tokens"]) == (4, 6, 8)
    e2e = sorted(r.t_end - r.t_sent for r in by_prompt[0])
    assert f["e2e_s_p50"] == pytest.approx(sum(e2e) / 2)  # two successes only
    assert not level.timed_out


def test_the_level_timeout_bounds_the_loop():
    # a 30 s stall against a 1 s level limit: every request failed, cancelled, shows it was cut
    with FakeServer(Fake(stall_s=30)) as server:
        level = lg.run_level(server.url, "/v1/completions", prompts("a", "b"), users=2,
                             requests_per_user=3, body=body, request_timeout_s=60,
                             level_timeout_s=1.0)
    assert level.timed_out
    assert all(not r.ok for r in level.records) and len(level.records) == 6
    cancelled = [r for r in level.records if r.sent]
    assert len(cancelled) == 2 and all("level's time ran out" in r.error for r in cancelled)
    assert all(r.error.startswith("not sent") for r in level.records if not r.sent)
    assert lf.level_figures(level.records, 2)["errors"] == 6


def test_a_request_past_its_timeout_fails_and_the_next_is_sent():
    with FakeServer(Fake(stall_s=1.5)) as server:
        level = lg.run_level(server.url, "/v1/completions", prompts("a"), users=1,
                             requests_per_user=2, body=body, request_timeout_s=0.3,
                             level_timeout_s=20)
    assert [r.error.startswith("timeout") for r in level.records] == [True, True]
    assert all(r.sent for r in level.records) and not level.timed_out


def test_a_refused_connection_is_a_failure():
    level = lg.run_level(f"http://127.0.0.1:{free_port()}", "/v1/completions", prompts("a"),
                         users=2, requests_per_user=1, body=body, request_timeout_s=5,
                         level_timeout_s=10)
    assert all(r.error.startswith("ConnectError") for r in level.records)


# ---------------------------------------------------------------------------------------------
# the benchmark against the fake server


def stress_run(url: str, users: int, api: str = "completions", **params):
    ctx = cpu_context("tiny:llama")
    kept = []
    ctx.keep = kept.append
    p = StressParams(users=users, requests_per_user=2, prompts=4, prompt_tokens=16,
                     max_tokens=8, api=api, server={"url": url, "logprobs": True}, **params)
    try:
        out = measurement(Stress).run(p, implementation(Identity()), ctx)
    finally:
        ctx.memo.close()
    return out, kept


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_cache_leaking_between_sessions_is_flagged(api):
    with FakeServer(Fake(leak=True, token_s=0.01)) as server:
        alone, _ = stress_run(server.url, users=1, api=api)
        out, kept = stress_run(server.url, users=4, api=api)
        assert server.fake.most_in_flight == 4
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert alone.metrics["token_agreement"].value == 1.0
    assert alone.metrics["responses_flagged"].value == 0
    assert m["errors"] == 0 and m["requests"] == 8 and m["output_tokens"] == 64
    assert m["responses_differing"] == 8 and m["responses_flagged"] == 8
    assert m["token_agreement"] == pytest.approx(2 / 8)  # the first 2 tokens agree
    assert m["sessions_held"] == 4
    assert len(kept) == 8 and kept[0]["first_difference"] == 2 and kept[0]["flagged"]
    assert kept[0]["margin_there"] == pytest.approx(3.0)
    assert out.info["token_count_source"] == {"usage": 8}
    assert out.info["token_ids_source"] == {"token_ids": 8}
    assert out.info["logprobs"] is True


def test_a_flip_at_a_near_tie_differs_but_is_not_flagged():
    with FakeServer(Fake(leak=True, leak_at=3, tie_at=3, tie=0.01, token_s=0.01)) as server:
        out, kept = stress_run(server.url, users=3)
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert m["responses_differing"] == 6 and m["responses_flagged"] == 0
    assert m["token_agreement"] == pytest.approx(3 / 8)
    assert kept and not any(k["flagged"] for k in kept)


def test_errors_are_counted_and_the_metrics_are_complete(fake):
    out, _ = stress_run(fake.url, users=2)
    # free text, no long-prompt user, no shared prefix: every metric but those three's
    assert list(out.metrics) == [m for m in Stress.metrics if m not in TASK_METRICS
                                 and m not in PREFIX_METRICS and m != "long_prompt_ttft_s"]
    assert out.metrics["slo_attainment"].value == 1.0  # the default SLOs, a fast fake
    assert out.metrics["answer_tokens"].value == out.metrics["answer_tokens_alone"].value == 8
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert m["errors"] == 0 and m["token_agreement"] == 1.0 and m["responses_differing"] == 0
    assert m["aggregate_vs_single"] == pytest.approx(
        m["output_tok_s"] / out.info["single_user_tok_s"])
    assert out.metrics["aggregate_vs_single"].timing == "ratio"
    assert out.metrics["ttft_s_p99"].timing == "absolute"
    assert out.metrics["errors"].timing is None
    assert out.info["requests_summary"] == {"planned": 4, "sent": 4, "ok": 4, "failed": 0}
    assert out.info["server_uses_method"] is False and out.info["server_log"] is None


def test_repeats_give_samples_and_totals(fake):
    ctx = cpu_context("tiny:llama", repeats=2)
    p = StressParams(users=2, requests_per_user=1, prompts=2, prompt_tokens=8, max_tokens=4,
                     server={"url": fake.url})
    try:
        out = measurement(Stress).run(p, implementation(Identity()), ctx)
    finally:
        ctx.memo.close()
    assert len(out.metrics["ttft_s_p50"].samples) == 2
    assert len(out.metrics["aggregate_vs_single"].samples) == 2
    assert out.metrics["requests"].value == 4 and out.metrics["output_tokens"].value == 16
    assert out.info["repeats"] == 2
    # the warm-up (1), the single-user pass (2 prompts), then 2 repeats of 2 users
    assert fake.fake.requests == 1 + 2 + 4


def test_without_logprobs_every_difference_is_flagged():
    with FakeServer(Fake(leak=True, leak_at=3, tie_at=3, tie=0.0, token_s=0.01)) as server:
        ctx = cpu_context("tiny:llama")
        p = StressParams(users=3, prompts=4, prompt_tokens=16, max_tokens=8,
                         server={"url": server.url})  # logprobs not asked
        try:
            out = measurement(Stress).run(p, implementation(Identity()), ctx)
        finally:
            ctx.memo.close()
    assert out.info["logprobs"] is False
    assert out.metrics["responses_flagged"].value == out.metrics["responses_differing"].value > 0


# ---------------------------------------------------------------------------------------------
# managed servers


GRANDCHILD_SERVER = textwrap.dedent("""\
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open(sys.argv[2], "w").write(str(child.pid))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            print(*args, flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """)


def _gone(pid: int, wait_s: float = 2.0) -> bool:
    """Whether `pid` is gone (or a zombie waiting for init) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z" or time.monotonic() > deadline:
            return state == "Z"
        time.sleep(0.02)


def test_a_managed_server_is_stopped_with_everything_it_started(tmp_path):
    port = free_port()
    pidfile = tmp_path / "grandchild.pid"
    log = tmp_path / "logs" / "server.log"
    server = ManagedServer([sys.executable, "-c", GRANDCHILD_SERVER, str(port), str(pidfile)],
                           f"http://127.0.0.1:{port}", log, "test", ready_timeout_s=20).start()
    pid, grandchild = server.process.pid, int(pidfile.read_text())
    assert not _gone(grandchild, wait_s=0)
    server.close()
    assert _gone(pid) and _gone(grandchild)
    text = log.read_text()
    assert "starting" in text and "GET /health" in text and "stopped" in text
    server.close()  # a second close does nothing


def test_a_server_that_exits_early_fails_with_its_log(tmp_path):
    log = tmp_path / "s.log"
    script = "import sys; print('cannot load the model: no such file', flush=True); sys.exit(3)"
    server = ManagedServer([sys.executable, "-c", script], "http://127.0.0.1:1", log, "t")
    with pytest.raises(ServerError, match=r"exited \(code 3\)(.|\n)*cannot load the model"):
        server.start()
    assert server.process is None


def test_a_server_killed_by_a_signal_names_it(tmp_path):
    """As llama.cpp built for another CPU dies on its first vector instruction."""
    script = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    server = ManagedServer([sys.executable, "-c", script], "http://127.0.0.1:1",
                           tmp_path / "s.log", "t")
    with pytest.raises(ServerError, match=r"exited \(killed by SIGILL: an instruction this CPU"):
        server.start()


def test_a_server_never_ready_is_stopped_after_its_wait(tmp_path):
    server = ManagedServer([sys.executable, "-c", "import time; time.sleep(60)"],
                           f"http://127.0.0.1:{free_port()}", tmp_path / "s.log", "t",
                           ready_timeout_s=0.5)
    with pytest.raises(ServerError, match="not ready within 0.5 s"):
        server.start()
    assert server.process is None


class _Stub(RunningServer):
    def __init__(self, name, closed):
        self.url, self.name, self.closed = "http://127.0.0.1:1", name, closed

    def close(self):
        self.closed.append(self.name)


def test_the_pool_keeps_servers_for_later_cases_and_stops_the_oldest_when_full():
    pool, closed = ServerPool(size=2), []
    a, fresh = pool.acquire(("a",), lambda: _Stub("a", closed))
    assert fresh and pool.acquire(("a",), lambda: _Stub("a2", closed)) == (a, False)
    b, fresh = pool.acquire(("b",), lambda: _Stub("b", closed))
    assert fresh and closed == []  # a waits for its next case
    assert pool.acquire(("a",), lambda: _Stub("a3", closed)) == (a, False)  # a is now newest
    pool.acquire(("c",), lambda: _Stub("c", closed))
    assert closed == ["b"]  # the least recently used stops before the next starts
    pool.close()
    assert closed == ["b", "a", "c"] and pool.servers == {}


@pytest.mark.slow
def test_mlx_lm_server_managed_on_loopback(tmp_path):
    """A real third-party server kvbench starts and stops: mlx_lm.server on the bundled model."""
    pytest.importorskip("mlx_lm")
    from kvbench.models.bundled import bundled_dir, is_prepared

    if not is_prepared("smollm2-135m"):
        pytest.skip("the bundled model is not prepared (kvbench models prepare smollm2-135m)")
    folder = bundled_dir("smollm2-135m")
    text = tmp_path / "text.txt"  # a short text: the prompts are windows of it
    text.write_text(" ".join(f"The key {i} and value {i * 7} of the cache." for i in range(60)))
    ctx = cpu_context("bundled:smollm2-135m")
    ctx.files_dir = tmp_path / "files"
    command = [sys.executable, "-m", "mlx_lm.server", "--model", str(folder), "--host",
               "127.0.0.1", "--port", "{port}"]
    params = StressParams(users=2, requests_per_user=1, prompts=2, prompt_tokens=24,
                          max_tokens=4, text=str(text),
                          server={"command": command, "url": "http://127.0.0.1:{port}"})
    try:
        out = measurement(Stress).run(params, implementation(Identity()), ctx)
        [server] = ctx.memo.get(POOL_MEMO_KEY, ServerPool).servers.values()
        pid, port = server.process.pid, int(server.url.rsplit(":", 1)[1])
    finally:
        ctx.memo.close()
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert m["errors"] == 0 and m["requests"] == 2, out.info["failures"]
    assert m["output_tokens"] > 0
    # mlx_lm.server sends usage but no token ids: the ids compared come from the tokenizer
    assert out.info["token_ids_source"] == {"tokenizer": 2}
    assert out.info["token_count_source"] == {"usage": 2}
    assert m["token_agreement"] == 1.0  # greedy, the same server: the single-user answers
    log = Path(out.info["server_log"])
    assert log.parent == ctx.files_dir and "mlx_lm.server" in log.read_text()
    assert _gone(pid)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_a_suite_run_shares_one_managed_server_over_its_levels(tmp_path):
    """kvbench run: the command server starts once for both levels, its log is beside the
    results, the report has the stress section, and nothing is left running."""
    from kvbench.report.markdown import render_markdown
    from kvbench.run.runner import run_suite
    from kvbench.suite.loader import load_suite

    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r});"
              " from tests.test_stress import serve_fake; serve_fake(int(sys.argv[1]))")
    suite = tmp_path / "stress.yaml"
    suite.write_text(textwrap.dedent(f"""\
        kvbench: 1
        name: stress-fake
        defaults: {{model: "tiny:llama", device: cpu}}
        methods:
          - name: identity
        benchmarks:
          - kind: stress
            params:
              prompts: 4
              prompt_tokens: 16
              max_tokens: 8
              server:
                command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}, "{{port}}"]
                url: "http://127.0.0.1:{{port}}"
            matrix: {{users: [1, 3]}}
            claims:
              - "errors == 0"
              - "token_agreement == 1"
        """))
    outcome = run_suite(load_suite(suite), tmp_path / "out")
    cases = outcome.result.cases
    assert [c.status for c in cases] == ["ok", "ok"], [c.error for c in cases]
    assert all(claim.verdict == "held" for c in cases for claim in c.claims)
    assert [c.info["server_started_for_this_case"] for c in cases] == [True, False]
    log = Path(cases[0].info["server_log"])
    assert log.parent == tmp_path / "out" / "files"
    text = log.read_text()
    assert text.count("starting") == 1 and "stopped" in text
    port = int(cases[0].info["server_command"][-1])  # "{port}", filled
    with pytest.raises(OSError):  # stopped when the run ended
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert "### Concurrent users" in render_markdown(outcome.result)


# ---------------------------------------------------------------------------------------------
# the report


def _metric(value, unit="", direction="none", timing=None):
    from kvbench.results import Metric

    return Metric(value=value, unit=unit, direction=direction, timing=timing)


def stress_case(label: str, users: int, tok_s: float, flagged: int = 0, errors: int = 0,
                status: str = "ok", long_ttft: float = math.nan):
    from kvbench.results import CaseResult

    values = {"output_tok_s": tok_s, "per_user_tok_s": tok_s / users,
              "aggregate_vs_single": tok_s / 10, "ttft_s_p99": 0.1 * users,
              "chunk_gap_s_p99": 0.01 * users, "chunk_gap_s_max": 0.0125 * users,
              "long_prompt_ttft_s": long_ttft,
              "e2e_s_p99": 1.0 + users, "errors": errors,
              "token_agreement": 1.0 - flagged / 10, "responses_differing": 2 * flagged,
              "responses_flagged": flagged,
              "sessions_held": users, "ttft_s_p50": math.nan}
    return CaseResult(
        id=f"stress/{label}/users={users}", benchmark="stress",
        bench_params={"users": users, "requests_per_user": 2, "prompts": 8,
                      "prompt_tokens": 64, "max_tokens": 32, "text": "pydoc", "offset": 0,
                      "api": "completions", "server": "kvbench", "kv_budget": 0,
                      "request_timeout_s": 120.0, "level_timeout_s": 900.0,
                      "tie_margin": 0.05, "ignore_eos": True},
        method=label, method_label=label, method_params={}, model="tiny:llama", status=status,
        metrics={k: _metric(v) for k, v in values.items()},
        info={"server": "kvbench serve (started by kvbench)",
              "failures": {"HTTP 503: full": errors} if errors else {}})


@pytest.fixture
def stress_result():
    from tests.test_report_retrieval import run

    cases = [stress_case("leaky", 1, 10.0), stress_case("identity", 1, 10.0),
             stress_case("identity", 4, 30.0), stress_case("leaky", 4, 28.0, flagged=3),
             stress_case("identity", 2, 18.0, errors=2)]
    return run(cases)


def test_the_report_has_a_table_per_method_and_warnings(stress_result):
    from kvbench.report.markdown import render_markdown
    from tests.test_report_retrieval import _row

    text = render_markdown(stress_result)
    assert "## stress" in text and "### Concurrent users" in text
    identity = text[text.index("**identity**"):]
    rows = [line for line in identity.splitlines()[4:7]]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2", "4"]  # sorted by users
    assert _row(identity, "4")[:6] == ["4", "30.0", "7.50", "3.00", "0.400", "0.040"]
    leaky = text[text.index("**leaky**"):]
    assert _row(leaky, "4")[8:12] == ["0.700", "6", "3", "4"]
    assert "long-prompt" not in text  # no level had a long-prompt user
    assert "**leaky** at 4 users: 3 response(s) differ" in text
    assert "**identity** at 2 users: 2 failed request(s): 2× HTTP 503: full" in text
    assert ("all lines: requests_per_user=2 · prompts=8 · prompt_tokens=64 · max_tokens=32 ·"
            " api=completions · text=pydoc · tie_margin=0.05 · server: kvbench serve") in text


def test_a_long_prompt_user_gets_its_column_where_a_level_had_one():
    from kvbench.report.markdown import render_markdown
    from tests.test_report_retrieval import _row, run

    text = render_markdown(run([stress_case("identity", 1, 10.0),
                                stress_case("identity", 4, 30.0, long_ttft=12.5)]))
    assert "long-prompt TTFT s" in text and "*long-prompt user*" in text
    assert _row(text, "4")[-2:] == ["0.05", "12.50"] and _row(text, "1")[-1] == "—"


def test_the_figure_has_three_panels_one_line_per_method(stress_result, tmp_path):
    pytest.importorskip("matplotlib")
    from kvbench.benchmarks.reports import stress_figures
    from kvbench.benchmarks.reports.stress_table import stress_table
    from kvbench.report.markdown import write_reports
    from tests.test_report_retrieval import PNG_MAGIC

    write_reports(stress_result, tmp_path)
    assert (tmp_path / stress_figures.THROUGHPUT_PNG).read_bytes()[:8] == PNG_MAGIC
    assert f"]({stress_figures.THROUGHPUT_PNG})" in (tmp_path / "report.md").read_text()
    plot = stress_figures.stress_throughput_png(stress_table(stress_result), tmp_path / "p.png",
                                                "t").plot
    assert set(plot) == {"output_tok_s", "per_user_tok_s", "ttft_s_p99"}
    assert plot["output_tok_s"]["identity"] == ([1, 2, 4], [10.0, 18.0, 30.0])
    assert plot["per_user_tok_s"]["leaky"] == ([1, 4], [10.0, 7.0])


def test_one_level_per_method_draws_no_figure(tmp_path):
    """An interrupted run (on CUDA: one level of each method) has no curve; the report is still
    written, without the figure."""
    pytest.importorskip("matplotlib")
    from kvbench.benchmarks.reports.stress_figures import THROUGHPUT_PNG
    from kvbench.report.markdown import write_reports
    from tests.test_report_retrieval import run

    report = write_reports(run([stress_case("identity", 1, 10.0), stress_case("intq", 1, 9.0)]),
                           tmp_path).read_text()
    assert "**intq**" in report and THROUGHPUT_PNG not in report
    assert not (tmp_path / THROUGHPUT_PNG).exists()


def test_without_matplotlib_the_stress_section_says_so(stress_result, without_matplotlib):
    from kvbench.report.markdown import render_markdown

    assert "stress plot skipped: matplotlib is not installed" in render_markdown(stress_result)


def test_two_settings_of_one_method_are_two_lines(stress_result):
    from kvbench.benchmarks.reports import stress
    from kvbench.benchmarks.reports.stress_table import stress_table

    other = stress_case("identity", 1, 5.0)
    other.bench_params["kv_budget"] = 1 << 20
    stress_result.cases.append(other)
    table = stress_table(stress_result)
    assert set(table.lines) == {"identity (kv_budget=0)", "identity (kv_budget=1048576)",
                                "leaky"}
    assert "KV budgets (kvbench serve --kv-budget): none, 1 MiB" in stress.stress_section(
        stress_result)


def test_the_plot_draws_curves_only_and_names_them_by_method():
    """A single-level run of a method under another setting (a capacity run) gets its own table
    but no curve, and the curves are labelled by method alone when that tells them apart."""
    from tests.test_report_retrieval import run
    from kvbench.benchmarks.reports.stress_figures import _short_labels, panel_lines
    from kvbench.benchmarks.reports.stress_table import stress_table

    capacity = stress_case("identity", 40, 12.0)
    capacity = capacity.model_copy(update={
        "bench_params": {**capacity.bench_params, "kv_budget": 75_000_000}})
    table = stress_table(run([stress_case("identity", 1, 10.0), stress_case("identity", 4, 30.0),
                              stress_case("leaky", 1, 10.0), stress_case("leaky", 4, 28.0),
                              capacity]))
    assert len(table.lines) == 3  # identity under two settings: two lines
    lines = panel_lines(table, "output_tok_s")
    assert len(lines) == 2 and all(x == [1, 4] for x, _ in lines.values())
    assert sorted(_short_labels(table, list(lines)).values()) == ["identity", "leaky"]


def test_a_long_prompt_user_joins_the_level_mid_stream(fake):
    """One more request, sent long_prompt_after_s into the level: counted in requests, timed
    as long_prompt_ttft_s, kept out of the others' latencies and of the answer checks (it has
    no single-user answer)."""
    out, kept = stress_run(fake.url, users=2, long_prompt_tokens=40, long_prompt_after_s=0.05)
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert m["requests"] == 5 and m["errors"] == 0
    assert m["responses_differing"] == 0 and not kept
    assert m["output_tokens"] == 4 * 8  # the four users' requests only
    assert 0 < m["long_prompt_ttft_s"] < 5
    assert out.info["requests_summary"]["sent"] == 5
    # the warm-up (1), the single-user pass (4 prompts), 2 users x 2 requests, the long one
    assert fake.fake.requests == 1 + 4 + 4 + 1
    plain, _ = stress_run(fake.url, users=2)
    assert "long_prompt_ttft_s" not in plain.metrics  # no long-prompt user: nothing to time
    assert plain.metrics["requests"].value == 4


def test_the_long_prompt_user_is_sent_after_its_delay():
    with FakeServer(Fake(token_s=0.06)) as server:  # 4 tokens: the others stream 0.24 s
        level = lg.run_level(server.url, "/v1/completions", prompts("a", "b"), users=2,
                             requests_per_user=1, body=body, request_timeout_s=10,
                             level_timeout_s=10, long=(Prompt(-1, "long", [9] * 40), 0.1))
    first_sent = min(r.t_sent for r in level.records)
    assert level.long is not None and level.long.ok and level.long.user == -1
    assert level.long.t_sent - first_sent >= 0.1
    assert len(level.records) == 2 and all(r.prompt in (0, 1) for r in level.records)
    assert server.fake.most_in_flight == 3  # it joined while the others streamed


def test_a_failed_long_prompt_is_an_error_of_the_level(monkeypatch, fake):
    from kvbench.benchmarks.measure import stress

    real = stress.make_long_prompt
    monkeypatch.setattr(stress, "make_long_prompt",
                        lambda *a: Prompt(-1, "FAIL " + real(*a).text, real(*a).ids))
    out, _ = stress_run(fake.url, users=2, long_prompt_tokens=40, long_prompt_after_s=0.0)
    assert out.metrics["errors"].value == 1 and out.metrics["requests"].value == 5
    assert math.isnan(out.metrics["long_prompt_ttft_s"].value)
    assert any(reason.startswith("long prompt: HTTP 500") for reason in out.info["failures"])
