"""The official `openai` SDK against a real `kvbench serve` process (the tiny model): every
parameter of the README's API surface table is honoured or refused with 400, never ignored."""
import json
import threading

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import httpx  # noqa: E402 - after the skip: the serve extra brings it

from tests.test_serve_hostile import _serve

openai = pytest.importorskip("openai", reason="the openai SDK is not installed (the dev extra)")

PROMPT = "The cache holds the keys and"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = _serve(tmp_path_factory.mktemp("sdk"))
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def _greedy(client, extra_body=None, **extra):
    """24 tokens of PROMPT (ignore_eos; greedy unless `extra` sets a temperature), with
    `extra` parameters and `extra_body` fields (what the SDK has no argument for)."""
    return client.completions.create(**{"model": "tiny:llama", "prompt": PROMPT,
                                        "max_tokens": 24, "temperature": 0, **extra},
                                     extra_body={"ignore_eos": True, **(extra_body or {})})


def test_stream_whole_and_raw_http_agree(client, server):
    whole = _greedy(client).choices[0].text
    streamed = "".join(chunk.choices[0].text for chunk in _greedy(client, stream=True)
                       if chunk.choices)
    raw = httpx.post(server + "/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}).json()
    assert whole == streamed == raw["choices"][0]["text"] and whole
    chat = dict(model="tiny:llama", messages=[{"role": "user", "content": "hi"}],
                max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    reply = client.chat.completions.create(**chat)
    chunks = client.chat.completions.create(**chat, stream=True)
    assert reply.choices[0].message.content == "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reply.usage.completion_tokens == 12


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list()] == ["tiny:llama"]
    assert client.models.retrieve("tiny:llama").id == "tiny:llama"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_explicit_nulls_are_defaults(server):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": None, "n": None, "stream": None,
            "logprobs": None, "stop": None, "seed": None, "top_p": None}
    reply = httpx.post(server + "/v1/completions", json=body)
    assert reply.status_code == 200 and reply.json()["choices"][0]["logprobs"] is None


def test_stop_strings_and_stop_token_ids_end_the_reply_before_them(client):
    full = _greedy(client, extra_body={"return_token_ids": True})
    text, ids = full.choices[0].text, full.choices[0].model_extra["token_ids"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    expected = text[:text.find(stop)]
    for stream in (False, True):
        reply = _greedy(client, stop=[stop], stream=stream)
        if stream:
            chunks = [c for c in reply if c.choices]
            got = "".join(c.choices[0].text for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            got, finish = reply.choices[0].text, reply.choices[0].finish_reason
        assert got == expected and finish == "stop"
    at = len(ids) // 2
    stopped = _greedy(client, extra_body={"stop_token_ids": [ids[at]],
                                          "return_token_ids": True})
    assert stopped.choices[0].model_extra["token_ids"] == ids[:ids.index(ids[at])]
    assert stopped.choices[0].finish_reason == "stop"


def test_logprobs_zero_echo_and_chat_logprobs(client):
    reply = _greedy(client, logprobs=0).choices[0]
    assert len(reply.logprobs.token_logprobs) == 24
    assert all(top == {} for top in reply.logprobs.top_logprobs)
    assert _greedy(client, echo=True).choices[0].text == PROMPT + _greedy(client).choices[0].text
    chat = client.chat.completions.create(
        model="tiny:llama", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        temperature=0, logprobs=True)
    assert [t.top_logprobs for t in chat.choices[0].logprobs.content] == [[], [], []]


def test_echo_with_logprobs_scores_the_prompt_and_openais_defaults_are_taken(client):
    """What lm-eval's loglikelihood requests ask (tests/test_serve_lm_eval.py checks the
    numbers), a batch of prompts, max_completion_tokens and response_format text, through the
    SDK."""
    scored = client.completions.create(model="tiny:llama", prompt=[PROMPT, "The values"],
                                       echo=True, logprobs=1, max_tokens=0, temperature=0)
    assert [c.index for c in scored.choices] == [0, 1]
    logprobs = scored.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert len(logprobs.tokens) == scored.usage.prompt_tokens - len(
        scored.choices[1].logprobs.tokens)
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert scored.choices[0].text == PROMPT and scored.usage.completion_tokens == 0
    chat = client.chat.completions.create(
        model="tiny:llama", messages=[{"role": "user", "content": "hi"}], temperature=0,
        max_completion_tokens=2, response_format={"type": "text"},
        extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError, match="response_format 'json_object'"):
        client.chat.completions.create(model="tiny:llama", messages=[{"role": "user",
                                                                      "content": "hi"}],
                                       response_format={"type": "json_object"})


def test_sampling_parameters_change_what_is_sampled(client):
    greedy = _greedy(client, extra_body={"return_token_ids": True})
    ids = greedy.choices[0].model_extra["token_ids"]
    # top_p so small that only the likeliest token is left: sampling at temperature 1 is greedy
    nucleus = _greedy(client, temperature=1.0, top_p=1e-9, seed=3,
                      extra_body={"return_token_ids": True})
    assert nucleus.choices[0].model_extra["token_ids"] == ids
    biased = _greedy(client, logit_bias={"65": 100},
                     extra_body={"return_token_ids": True})
    assert set(biased.choices[0].model_extra["token_ids"]) == {65}
    penalised = _greedy(client, presence_penalty=2.0, frequency_penalty=2.0,
                        extra_body={"return_token_ids": True})
    got = penalised.choices[0].model_extra["token_ids"]
    assert got != ids and len(set(got)) >= len(set(ids))


@pytest.mark.parametrize("extra, words", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"suffix": "x"}, "suffix"),
    ({"best_of": 2}, "best_of"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
])
def test_what_is_not_supported_is_refused_not_ignored(client, extra, words):
    with pytest.raises(openai.BadRequestError, match=words):
        _greedy(client, extra_body=extra)


def test_chat_without_max_tokens_runs_to_the_end_of_the_context(client):
    reply = client.chat.completions.create(
        model="tiny:llama", messages=[{"role": "user", "content": "hi"}], temperature=0,
        extra_body={"ignore_eos": True})
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == 4096  # tiny:llama's
    assert reply.choices[0].finish_reason == "length"


def test_a_request_that_can_never_fit_is_400_and_not_retried(tmp_path):
    # tiny:llama holds 512 bytes a token: one request of 28 + 300 tokens fits, two do not
    proc, url = _serve(tmp_path, "--kv-budget", 200_000, "--queue-timeout", 0)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")  # retries as shipped
        with pytest.raises(openai.BadRequestError, match="whole KV budget"):
            client.completions.create(model="tiny:llama", prompt=PROMPT * 20, max_tokens=200)
        metrics = httpx.get(url + "/metrics").text
        assert 'kvbench_requests_finished_total{outcome="rejected"} 1.0' in metrics
        # no room within the queue timeout (0 s): 503 with Retry-After, while another runs
        body = {"prompt": PROMPT, "max_tokens": 300, "temperature": 0, "ignore_eos": True,
                "stream": True}
        started = threading.Event()

        def hold():
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        started.set()

        holder = threading.Thread(target=hold)
        holder.start()
        assert started.wait(60)
        busy = httpx.post(url + "/v1/completions", json={**body, "stream": False})
        holder.join(60)
    finally:
        proc.terminate()
        proc.wait(30)
    assert busy.status_code == 503 and int(busy.headers["retry-after"]) > 0
    assert "queue timeout" in json.loads(busy.text)["error"]["message"]


def test_chat_content_as_text_parts_is_the_same_message(client):
    """guidellm sends a user message as a list of text parts; other part types are refused."""
    def reply(content):
        return client.chat.completions.create(
            model="tiny:llama", messages=[{"role": "user", "content": content}], max_tokens=6,
            temperature=0, extra_body={"ignore_eos": True}).choices[0].message.content

    assert reply([{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]) == \
        reply("hi there")
    with pytest.raises(openai.BadRequestError, match="messages"):
        reply([{"type": "image_url", "image_url": {"url": "data:,"}}])
