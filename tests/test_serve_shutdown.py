"""kvbench serve stops cleanly and wastes nothing on clients that left: SIGTERM mid-stream ends
every stream with an error event and [DONE] (a whole reply with 503) and the process exits 0;
a request whose client left while it was queued is never prefilled."""
import json
import signal
import threading

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import httpx  # noqa: E402 - after the skip: the serve extra brings it
import torch

from kvbench.methods import build_method, implementation
from kvbench.models.session import TorchSession
from kvbench.serve.engine import Engine
from kvbench.serve.events import Failed, Finished, Token
from kvbench.serve.request import Request
from tests.plugins.cli_support import wait_until
from tests.plugins.waits import HANG_S
from tests.test_serve_hostile import _serve



def active(url: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=HANG_S).text
    return float(next(line.split()[1] for line in metrics.splitlines()
                      if line.startswith("kvbench_requests_active ")))


def test_sigterm_mid_stream_ends_every_stream_and_exits_0(tmp_path):
    """Before: uvicorn re-raised SIGTERM after its shutdown (exit -15 within 0.6 s) and
    sse-starlette cut every stream without [DONE] or an error."""
    proc, url = _serve(tmp_path)
    # up to tiny:llama's context: the streams run until they are stopped
    context = httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"]
    body = {"prompt": [1, 2, 3], "max_tokens": context - 3, "temperature": 0, "ignore_eos": True}
    streams: list[list[str]] = [[] for _ in range(3)]
    started = [threading.Event() for _ in streams]
    whole: dict = {}

    def read(i: int) -> None:
        try:
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                              timeout=HANG_S) as reply:
                streams[i].append(reply.status_code)
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        streams[i].append(line[6:])
                        started[i].set()
        finally:
            started[i].set()  # a refused stream fails below, not by a hang

    def ask() -> None:
        reply = httpx.post(url + "/v1/completions", json=body, timeout=HANG_S)
        whole.update(status=reply.status_code, error=reply.json()["error"])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
    threads.append(threading.Thread(target=ask))
    for thread in threads:
        thread.start()
    try:
        assert all(event.wait(HANG_S) for event in started)
        wait_until(lambda: active(url) == len(threads), proc, "every request active")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_S) == 0, proc.stdout.read()
    finally:
        proc.kill()
    for thread in threads:
        thread.join(HANG_S)
    for lines in streams:
        assert lines[0] == 200 and lines[-1] == "[DONE]", lines[-3:]
        error = json.loads(lines[-2])["error"]
        assert error["message"] == "the server is shutting down" and error["code"] is None
        assert len(lines) < body["max_tokens"]  # stopped, not run to the end
    assert whole["status"] == 503 and whole["error"]["message"] == "the server is shutting down"


def test_a_request_whose_client_left_while_queued_is_never_prefilled(tiny_llama):
    """Before: the admission loop started every queued request without looking at
    `cancelled`, so clients that had left were prefilled and made active (dropped only at the
    next step). Here the first request's first token holds the engine inside admission while
    the three queued behind it are cancelled."""
    session = TorchSession(tiny_llama, torch.device("cpu"))
    prefills, step = [], session.step  # the decode steps go through step_rows

    def counted_step(*args, **kwargs):
        prefills.append(args[0])
        return step(*args, **kwargs)

    session.step = counted_step
    engine = Engine(session, implementation(build_method("identity", {})))
    ids = session.tokenizer.encode("The cache holds the keys")
    blocked, release = threading.Event(), threading.Event()
    events: dict[str, list] = {name: [] for name in ("first", "a", "b", "c")}
    done = {name: threading.Event() for name in events}

    def collect(name: str):
        def emit(event):
            if name == "first" and not events[name]:
                blocked.set()
                release.wait(HANG_S)  # the engine thread waits here, inside admission
            events[name].append(event)
            if isinstance(event, (Finished, Failed)):
                done[name].set()
        return emit

    engine.start()
    try:
        engine.submit(Request(ids, 4, collect("first"), ignore_eos=True))
        assert blocked.wait(HANG_S)
        for name in "abc":  # queued behind it, then their clients leave
            request = Request(ids, 4, collect(name), ignore_eos=True)
            engine.submit(request)
            engine.cancel(request)
        release.set()
        assert done["first"].wait(HANG_S)
    finally:
        release.set()
        engine.stop()
    assert [isinstance(e, Token) for e in events["first"]] == [True] * 4 + [False]
    assert all(not events[name] for name in "abc")  # not a token, not an error: never run
    assert prefills == [ids] and engine.totals.prompt_tokens == len(ids)  # the first alone
    assert engine.totals.finished == {"length": 1, "cancelled": 3}
