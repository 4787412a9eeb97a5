"""kvbench serve reads OpenAI's fields as OpenAI does: max_completion_tokens honoured (0
refused, as OpenAI's chat refuses it; a completion's max_tokens 0 generates nothing), a prompt
that fills the context named with its length, top_logprobs without logprobs refused,
response_format text accepted and the others refused, error codes strings or null. On the tiny
model, in process (fastapi's TestClient)."""
import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import torch  # noqa: E402 - after the skip

from kvbench.methods import build_method, implementation
from kvbench.models.session import TorchSession
from kvbench.serve.app import create_app
from kvbench.serve.engine import Engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tiny_llama):
    """(a TestClient of kvbench serve's app with identity, the model's context)."""
    from fastapi.testclient import TestClient

    session = TorchSession(tiny_llama, torch.device("cpu"))
    engine = Engine(session, implementation(build_method("identity", {})))
    engine.start()
    try:
        yield (TestClient(create_app(engine, "tiny:llama", "identity",
                                     tiny_llama.max_context)), tiny_llama.max_context)
    finally:
        engine.stop()


def chat(client, **body):
    return client.post("/v1/chat/completions", json={"messages": HI, "temperature": 0,
                                                     "ignore_eos": True, **body})


def refused(reply, param: str, words: str) -> dict:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error
    return error


def test_max_completion_tokens_is_honoured_and_0_refused_naming_it(served):
    client, _ = served
    reply = chat(client, max_completion_tokens=3, max_tokens=9)  # it replaces max_tokens
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    error = refused(chat(client, max_completion_tokens=0), "max_completion_tokens",
                    "max_completion_tokens must be at least 1, got 0")
    assert error["code"] == "integer_below_min_value"
    refused(chat(client, max_tokens=0), "max_tokens", "max_tokens must be at least 1, got 0")


def test_a_completion_with_max_tokens_0_generates_nothing(served):
    client, _ = served
    reply = client.post("/v1/completions", json={"prompt": "The cache", "max_tokens": 0,
                                                 "echo": True})
    assert reply.status_code == 200
    answer = reply.json()
    assert answer["choices"][0]["text"] == "The cache"  # the echo alone
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 0
    refused(client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}),
            "max_tokens", "max_tokens must be at least 0, got -1")


def test_a_prompt_that_fills_the_context_is_named_with_its_length(served):
    client, context = served
    long = "word " * (context + 50)
    reply = chat(client, messages=[{"role": "user", "content": long}])
    error = refused(reply, "messages", "leave no room for a reply")
    assert f"model's context of {context}" in error["message"]
    assert "max_tokens" not in error["message"] and error["code"] == "context_length_exceeded"
    tokens = int(error["message"].split("the prompt's ")[1].split(" tokens")[0])
    assert tokens > context


def test_top_logprobs_without_logprobs_is_refused_naming_it(served):
    client, _ = served
    refused(chat(client, top_logprobs=2, max_tokens=2), "top_logprobs",
            "top_logprobs needs logprobs: true")
    reply = chat(client, top_logprobs=2, logprobs=True, max_tokens=2).json()
    assert all(len(t["top_logprobs"]) == 2 for t in reply["choices"][0]["logprobs"]["content"])


def test_response_format_text_is_accepted_and_the_others_refused(served):
    client, _ = served
    plain = chat(client, max_tokens=3).json()["choices"][0]["message"]["content"]
    reply = chat(client, max_tokens=3, response_format={"type": "text"})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == plain
    for kind in ({"type": "json_object"},
                 {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}):
        refused(chat(client, max_tokens=3, response_format=kind), "response_format",
                f"response_format {kind['type']!r} is not supported")


@pytest.mark.parametrize("method, path, body, status", [
    ("post", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404),
    ("get", "/v1/models/gpt-4", None, 404),
    ("post", "/v1/completions", {"prompt": "x", "n": 2}, 400),
    ("post", "/v1/completions", {"prompt": "x", "temperature": -1}, 400),
    ("post", "/v1/completions", {"prompt": "x", "suffix": "y"}, 400),
    ("post", "/v1/chat/completions", {"messages": HI, "max_tokens": 10 ** 9}, 400),
])
def test_every_error_code_is_a_string_or_null(served, method, path, body, status):
    client, _ = served
    reply = client.post(path, json=body) if method == "post" else client.get(path)
    assert reply.status_code == status
    code = reply.json()["error"]["code"]
    assert code is None or isinstance(code, str), code
