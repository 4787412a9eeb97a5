"""kvbench serve: the engine's continuous batching, KV-budget admission, and the HTTP API (run
with uvicorn in a thread on a free loopback port, on the tiny model)."""
import json
import socket
import threading
import time

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import httpx  # noqa: E402 - after the skip: the serve extra brings it
import torch

from kvbench.methods import build_method, implementation
from kvbench.models.session import TorchSession, prefill
from kvbench.serve.admission import Projection
from kvbench.serve.app import create_app
from kvbench.models.batch_step import BatchStep
from kvbench.serve.engine import Engine
from kvbench.serve.events import Failed, Finished, Token
from kvbench.serve.request import Request
from tests.plugins.cli_support import invoke
from tests.plugins.model_runs import staggered_prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Settings that fit the tiny model (head_dim 16): every kind of policy, including a bias
# (am), query observers (snapkv, h2o), eviction and structured sparsity.
METHODS = [
    ("identity", {}),
    ("turbo", {"bits": 3, "block": 16}),
    ("kivi", {"bits": 2, "group_size": 16}),
    ("intq", {"bits": 4, "group_size": 16, "axis": "token"}),
    ("streamingllm", {"ratio": 0.3}),
    ("snapkv", {"budget": 24, "window": 8}),
    ("h2o", {"ratio": 0.3}),
    ("am", {"ratio": 0.5}),
    ("butterfly", {"block_size": 16, "window": 8}),
]


def _method(name: str, params: dict):
    """The method a suite names, as the torch backend runs it."""
    return implementation(build_method(name, params))


@pytest.fixture(scope="module")
def session(tiny_llama):
    return TorchSession(tiny_llama, torch.device("cpu"))


@pytest.fixture(scope="module")
def prompts(session):
    return staggered_prompts(session.tokenizer)


class Collect:
    """A request's events, and when each came."""

    def __init__(self):
        self.tokens, self.end, self.done = [], None, threading.Event()

    def __call__(self, event):
        if isinstance(event, Token):
            self.tokens.append(event.id)
        else:
            self.end = event
            self.done.set()


def generate(engine: Engine, prompts, max_tokens: int, together: bool) -> list[Collect]:
    """Each prompt's answer: all submitted at once (batched) or one after another."""
    outs = [Collect() for _ in prompts]
    for prompt, out in zip(prompts, outs):
        engine.submit(Request(prompt, max_tokens, out, ignore_eos=True))
        if not together:
            assert out.done.wait(60)
    for out in outs:
        assert out.done.wait(60)
    return outs


@pytest.mark.parametrize("name,params", METHODS, ids=[m for m, _ in METHODS])
def test_batched_decode_gives_each_request_its_own_answer(session, prompts, name, params):
    engine = Engine(session, _method(name, params))
    engine.start()
    try:
        alone = generate(engine, prompts, 12, together=False)
        steps_alone = engine.totals.decode_steps
        together = generate(engine, prompts, 12, together=True)
    finally:
        engine.stop()
    assert [o.end for o in alone] == [Finished("length", len(p), 12) for p in prompts]
    assert [o.tokens for o in together] == [o.tokens for o in alone]
    # the second pass really batched: fewer forwards than rows
    assert engine.totals.decode_steps - steps_alone < len(prompts) * 11
    assert engine.totals.decode_rows == 2 * len(prompts) * 11


@pytest.mark.parametrize("name,params", [METHODS[0], METHODS[1], METHODS[7]],
                         ids=["identity", "turbo", "am"])
def test_batched_step_logits_match_one_request_at_a_time(session, prompts, name, params):
    """Rows of different lengths (padding masked, positions per row) give each row the logits a
    batch-1 step gives, within float noise."""
    method = _method(name, params)

    def prefilled():
        caches = [session.new_cache(method) for _ in prompts]
        for cache, prompt in zip(caches, prompts):
            prefill(session, cache, prompt, method)
        return caches

    ids = [p[-1] for p in prompts]
    single = torch.stack([session.step([i], c)[0][-1] for i, c in zip(ids, prefilled())])
    batched = session.step_rows(ids, prefilled())
    assert torch.allclose(batched, single, atol=1e-4, rtol=1e-4)
    # without per-row positions the rows would be rotated wrongly: the check above can fail
    caches = prefilled()
    wrong = BatchStep(caches).run(session.loaded.model, torch.tensor([[i] for i in ids]),
                                  torch.zeros(len(ids), 1, dtype=torch.long))[:, -1].float()
    assert not torch.allclose(wrong, single, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,params", [METHODS[0], METHODS[1], METHODS[4], METHODS[5]],
                         ids=["identity", "turbo", "streamingllm", "snapkv"])
def test_projection_is_the_accounted_bytes_of_a_real_request(session, prompts, name, params):
    method = _method(name, params)
    prompt, new = prompts[2], 10
    cache = session.new_cache(method)
    logits = prefill(session, cache, prompt, method)[0]
    token = int(logits[-1].argmax())
    for _ in range(new - 1):
        token = int(session.step([token], cache)[0][-1].argmax())
    assert Projection(method, session).bytes(len(prompt), new) == cache.accounted_bytes()


def test_kv_budget_queues_requests_that_do_not_fit_and_never_errs(session, prompts):
    method = _method("identity", {})
    need = Projection(method, session).bytes(len(prompts[0]), 8)
    engine = Engine(session, method, kv_budget=2 * need + need // 2)  # room for two
    most_active = []

    def watch(out):
        def emit(event):
            most_active.append(engine.state()["active"])
            out(event)
        return emit

    outs = [Collect() for _ in range(5)]
    engine.start()
    try:
        for out in outs:
            engine.submit(Request(prompts[0], 8, watch(out), ignore_eos=True))
        for out in outs:
            assert out.done.wait(60)
    finally:
        engine.stop()
    assert all(isinstance(o.end, Finished) for o in outs)
    assert max(most_active) == 2
    assert engine.totals.finished == {"length": 5}


def test_a_request_past_the_queue_timeout_gets_503_and_one_past_the_budget_400(session, prompts):
    """503 with Retry-After for no room in time; 400 for a request that can never fit (a 503
    would have the OpenAI SDK retry it three times)."""
    method = _method("identity", {})
    need = Projection(method, session).bytes(len(prompts[0]), 40)
    engine = Engine(session, method, kv_budget=need, queue_timeout_s=0.0)
    first, second, too_big = Collect(), Collect(), Collect()
    engine.start()
    try:
        engine.submit(Request(prompts[0], 40, first, ignore_eos=True))
        engine.submit(Request(prompts[0], 40, second, ignore_eos=True))  # no room, no wait
        engine.submit(Request(prompts[4], 40, too_big, ignore_eos=True))
        for out in (first, second, too_big):
            assert out.done.wait(60)
    finally:
        engine.stop()
    assert isinstance(first.end, Finished)
    assert isinstance(second.end, Failed) and second.end.status == 503
    assert "queue timeout" in second.end.message and second.end.retry_after_s > 0
    assert isinstance(too_big.end, Failed) and too_big.end.status == 400
    assert too_big.end.retry_after_s is None
    assert "above the whole KV budget" in too_big.end.message


# -- HTTP ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(session):
    """(base url, engine) of kvbench serve's app on the tiny model with identity."""
    import uvicorn

    engine = Engine(session, _method("identity", {}))
    app = create_app(engine, "tiny:llama", "identity", session.loaded.max_context)
    port = _free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    engine.start()
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    yield url, engine
    uv.should_exit = True
    thread.join(10)
    engine.stop()


def metrics(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("kvbench_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def settled(url: str) -> dict[str, float]:
    """/metrics once no request is active and the engine, idle, has collected the finished
    caches (or after 30 s, whatever they are then)."""
    deadline = time.monotonic() + 30
    while True:
        now = metrics(url)
        idle = now["kvbench_requests_active"] == 0 and now["kvbench_live_caches"] == 0
        if idle or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def stream(url: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    return [json.loads(c) for c in chunks[:-1]]


def test_health_says_what_ran_the_codecs(session):
    """/health's impl is the method's ImplLog, as a run's info.impl: what the stress benchmark
    records per case (kernels or torch, fused attention or decoded reads)."""
    from fastapi.testclient import TestClient

    from kvbench.benchmarks.measure.kvbench_serve import kvbench_server_impl

    engine = Engine(session, _method("intq", {"bits": 4}))
    app = create_app(engine, "tiny:llama", "intq", session.loaded.max_context)
    engine.start()
    try:
        with TestClient(app) as client:
            assert client.get("/health").json()["impl"] == {}  # nothing encoded yet
            body = {"prompt": "The cache", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
            assert client.post("/v1/completions", json=body).status_code == 200
            impl = client.get("/health").json()["impl"]
    finally:
        engine.stop()
    assert impl == engine.method.impl_log.summary() and impl["encode"] == "torch"
    assert kvbench_server_impl("http://127.0.0.1:9") == {}  # nothing there: nothing said


def test_completion_stream_and_whole_agree_and_fill_usage(server):
    url, _ = server
    body = {"model": "tiny:llama", "prompt": "The cache", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    whole = httpx.post(url + "/v1/completions", json={**body, "logprobs": 2}).json()
    choice = whole["choices"][0]
    assert whole["usage"] == {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 6
    logprobs = choice["logprobs"]
    # greedy: each token is its step's best (top entries are keyed by text, so two tokens that
    # decode alike, as the tiny model's bytes can, share one key)
    assert all(1 <= len(top) <= 2 and lp == pytest.approx(max(top.values()))
               for lp, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"]))
    chunks = stream(url, {**body, "stream_options": {"include_usage": True}})
    token_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["token_ids"]]
    assert len(token_chunks) == 6  # one token per chunk
    assert [c["choices"][0]["token_ids"][0] for c in token_chunks] == choice["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == choice["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_chat_and_models(server):
    url, _ = server
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "tiny:llama"
    reply = httpx.post(url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
        "ignore_eos": True}).json()
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] == 3
    with httpx.stream("POST", url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "temperature": 0, "stream": True, "ignore_eos": True}) as chunks:
        lines = [line for line in chunks.iter_lines() if line.startswith("data: {")]
    deltas = [json.loads(line[6:])["choices"][0] for line in lines]
    assert all(d.get("delta") is not None for d in deltas)
    assert "".join(d["delta"].get("content", "") for d in deltas) == \
        reply["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body,status,words", [
    ({"prompt": "x", "max_tokens": -3}, 400, "max_tokens must be at least 0, got -3"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "does not exist"),
    ({"prompt": "x" * 5000}, 400, "above the model's context"),
    ({"prompt": [1, 2, 99999]}, 400, "within the vocabulary"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "x", "n": 2}, 400, "n = 1"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("{not json", 400, "not valid JSON"),
    ("[1, 2]", 400, "JSON object"),
])
def test_bad_requests_get_the_right_status_and_the_server_keeps_serving(server, body, status,
                                                                        words):
    url, _ = server
    content = body if isinstance(body, str) else json.dumps(body)
    reply = httpx.post(url + "/v1/completions", content=content,
                       headers={"content-type": "application/json"})
    assert reply.status_code == status
    assert words in reply.json()["error"]["message"]
    ok = httpx.post(url + "/v1/completions", json={"prompt": "y", "max_tokens": 2})
    assert ok.status_code == 200


def test_a_storm_of_abandoned_streams_leaves_nothing_behind(server):
    url, engine = server
    body = {"prompt": "The cache", "max_tokens": 3, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    before = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]["token_ids"]
    idle = settled(url)
    finished_before = dict(engine.totals.finished)

    def abandon(i):
        with httpx.stream("POST", url + "/v1/completions",
                          json={**body, "max_tokens": 400, "stream": True}) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    return  # leave after the first token: the connection closes

    threads = [threading.Thread(target=abandon, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    now = settled(url)
    for name in ("kvbench_requests_active", "kvbench_requests_queued", "kvbench_live_caches",
                 'kvbench_kv_bytes{method="identity"}',
                 'kvbench_kv_measured_bytes{method="identity"}'):
        assert now[name] == idle[name] == 0, name
    cancelled = engine.totals.finished.get("cancelled", 0) - finished_before.get("cancelled", 0)
    assert cancelled == 16
    # every abandoned stream stopped long before its 400 tokens
    assert now["kvbench_generated_tokens_total"] - idle["kvbench_generated_tokens_total"] < 16 * 400
    after = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]["token_ids"]
    assert after == before


def test_serve_refuses_bad_settings_before_loading_anything():
    result = invoke("serve", "--host", "0.0.0.0")
    assert result.exit_code == 2 and "not a loopback address" in result.output
    result = invoke("serve", "--params", "[1]")
    assert result.exit_code == 2 and "--params" in result.output
    result = invoke("serve", "--method", "turbbo")
    assert result.exit_code == 2 and "Did you mean 'turbo'" in result.output


@pytest.mark.model
@pytest.mark.parametrize("method,caught", [("identity", False), ("shared", True)])
def test_the_stress_benchmark_catches_a_cache_shared_between_sessions(tmp_path, method, caught):
    """`kvbench serve` (a real process) whose method reads every sequence's keys through one
    shared buffer answers one user correctly and several users wrongly: the stress benchmark's
    comparison with the single-user answers flags it, and passes the sound identity server.
    On the bundled model: the tiny model's random weights barely condition on their context, so
    another context's candidates look like their own."""
    from kvbench.benchmarks import measurement
    from kvbench.benchmarks.specs.stress import Stress, StressParams
    from kvbench.methods.settings.identity import Identity
    from tests.plugins.kvb_testplugin import SharedCache
    from tests.plugins.model_runs import cpu_context

    ctx = cpu_context("bundled:smollm2-135m")
    ctx.files_dir = tmp_path
    params = StressParams(users=4, requests_per_user=1, prompts=4, prompt_tokens=40,
                          max_tokens=12)
    try:
        settings = SharedCache() if method == "shared" else Identity()
        out = measurement(Stress).run(params, implementation(settings), ctx)
    finally:
        ctx.memo.close()
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert m["errors"] == 0 and m["requests"] == 4, out.info.get("failures")
    if caught:
        assert m["responses_flagged"] >= 3 and m["token_agreement"] < 0.8
    else:
        assert m["responses_flagged"] == 0 and m["token_agreement"] == 1.0
    log = next(tmp_path.glob("*.log")).read_text()
    assert "serving on http://127.0.0.1:" in log
