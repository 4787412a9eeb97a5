"""kvbench serve scores prompts (echo with logprobs): with identity the logprobs are the model's
own; with a lossy method they are the perplexity benchmark's (its first prefill_tokens prefilled
and compressed, the rest scored through the cache); a batch of prompts, as token-id lists, gets
a choice per prompt. On the tiny model, in process (fastapi's TestClient)."""
import math

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import torch  # noqa: E402 - after the skip

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.data.text import token_window
from kvbench.methods import build_method, implementation
from kvbench.models.session import TorchSession
from kvbench.serve.app import create_app
from kvbench.serve.engine import Engine
from tests.plugins.model_runs import cpu_context

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# the torch reference path: the fused CPU kernels compile for 20 s in each process
INTQ = ("intq", {"bits": 4, "group_size": 16, "axis": "token", "impl": "torch"})
# what it drops depends on positions alone: the server's batched step and the benchmark's batch-1
# step agree to float rounding (a 4-bit rounding boundary can make the last bits a visible step)
EVICTING = ("streamingllm", {"ratio": 0.3})
TEXT = "The cache holds the keys and the values of every token the model has seen so far"


@pytest.fixture(scope="module")
def session(tiny_llama):
    return TorchSession(tiny_llama, torch.device("cpu"))


@pytest.fixture(scope="module")
def clients(session):
    """A TestClient of kvbench serve's app per method name (identity, intq), made on first
    use."""
    from fastapi.testclient import TestClient

    made, engines = {}, []

    def client(name: str, params: dict):
        if name not in made:
            engine = Engine(session, implementation(build_method(name, params)))
            engine.start()
            engines.append(engine)
            made[name] = TestClient(create_app(engine, "tiny:llama", name,
                                               session.loaded.max_context))
        return made[name]

    yield client
    for engine in engines:
        engine.stop()


def score(client, ids: list[int], **extra) -> dict:
    reply = client.post("/v1/completions", json={"prompt": ids, "echo": True, "logprobs": 1,
                                                 "max_tokens": 0, "temperature": 0, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def model_logprobs(model, ids: list[int]) -> list[float]:
    """Each token's logprob given the ones before it, from one forward of the transformers
    model itself (no cache, no kvbench path)."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].tolist()


def test_identity_scores_every_prompt_token_as_the_model_does(clients, session, tiny_llama):
    ids = session.tokenizer.encode(TEXT)
    answer = score(clients("identity", {}), ids)
    logprobs = answer["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    got = logprobs["token_logprobs"][1:]
    assert len(got) == len(ids) - 1  # max_tokens 0: the prompt alone
    assert max(abs(a - b) for a, b in zip(got, model_logprobs(tiny_llama.model, ids))) <= 1e-4
    # each top entry is the step's likeliest: a token is greedy when its logprob equals it
    assert all(len(top) == 1 and max(top.values()) >= lp - 1e-6
               for lp, top in zip(got, logprobs["top_logprobs"][1:]))
    assert answer["choices"][0]["text"] == session.tokenizer.decode(ids)
    assert answer["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                               "total_tokens": len(ids)}


def test_an_evicting_method_scores_the_prompt_as_the_perplexity_benchmark_does(clients,
                                                                           tiny_llama,
                                                                           tmp_path):
    """The server's echoed logprobs of a perplexity window's continuation, its context sent as
    prefill_tokens, sum to the perplexity benchmark's NLL of that window through streamingllm's
    cache; the plain model's NLL differs, so the agreement is the method's, not the model's."""
    text = tmp_path / "text.txt"  # a short text: pydoc's takes 20 s to tokenise here
    text.write_text(" ".join([TEXT] * 20))
    params = PerplexityParams(context=40, continuation=24, text=str(text), calibration=8)
    ctx = cpu_context(loaded=tiny_llama)
    try:
        out = measurement(Perplexity).run(params, implementation(build_method(*EVICTING)), ctx)
        window = out.info["windows"][0]
        ids, _ = token_window(ctx.memo, ctx.open_session(), params.text, window["offset"],
                              params.context + params.continuation)
    finally:
        ctx.memo.close()
    values = score(clients(*EVICTING), ids, prefill_tokens=params.context)["choices"][0]
    served = -math.fsum(values["logprobs"]["token_logprobs"][params.context:])
    assert math.isclose(served, window["nll"], rel_tol=1e-5, abs_tol=1e-4)
    assert abs(window["nll"] - window["nll_plain"]) > 100 * 1e-4


def test_the_split_defaults_to_half_the_prompt(clients, session):
    """Without prefill_tokens a scored prompt's first half (rounded up) is prefilled: its
    answer is the one sent with that split, and another split scores other numbers."""
    ids = session.tokenizer.encode(TEXT)
    client = clients(*INTQ)

    def logprobs(**extra):
        return score(client, ids, **extra)["choices"][0]["logprobs"]["token_logprobs"][1:]

    half = logprobs()
    assert half == logprobs(prefill_tokens=(len(ids) + 1) // 2)
    assert max(abs(a - b) for a, b in zip(half, logprobs(prefill_tokens=len(ids)))) > 1e-3


def test_a_batch_of_token_id_prompts_gets_a_choice_per_prompt(clients, session):
    """As lm-eval's local-completions sends them: a list of token-id lists (one or several),
    echo, logprobs 1, max_tokens 1; each choice is what its prompt gets alone."""
    client = clients("identity", {})
    prompts = [session.tokenizer.encode(TEXT), session.tokenizer.encode("The values")]
    batch = score(client, prompts, max_tokens=1)
    alone = [score(client, [ids], max_tokens=1)["choices"][0] for ids in prompts]
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    for choice, single, ids in zip(batch["choices"], alone, prompts):
        assert choice["logprobs"]["tokens"] == single["logprobs"]["tokens"]
        assert len(choice["logprobs"]["token_logprobs"]) == len(ids) + 1  # and the new token
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(
            single["logprobs"]["token_logprobs"], abs=1e-5)
    assert batch["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert batch["usage"]["completion_tokens"] == 2
    texts = client.post("/v1/completions", json={"prompt": ["The cache", "The values"],
                                                 "max_tokens": 3, "temperature": 0,
                                                 "ignore_eos": True}).json()
    assert [c["index"] for c in texts["choices"]] == [0, 1]
    assert texts["choices"][1]["text"] == client.post("/v1/completions", json={
        "prompt": "The values", "max_tokens": 3, "temperature": 0,
        "ignore_eos": True}).json()["choices"][0]["text"]


def test_a_scored_stream_sends_the_prompts_logprobs_in_its_echo_chunk(clients, session):
    import json

    client = clients("identity", {})
    ids = session.tokenizer.encode(TEXT)
    whole = score(client, ids, max_tokens=2, ignore_eos=True)["choices"][0]
    with client.stream("POST", "/v1/completions", json={
            "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 2, "temperature": 0,
            "ignore_eos": True, "stream": True}) as reply:
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line)["choices"][0] for line in lines[:-1]]
    echoed = chunks[0]["logprobs"]["token_logprobs"]
    assert chunks[0]["text"] == session.tokenizer.decode(ids) and len(echoed) == len(ids)
    assert echoed[0] is None
    assert echoed[1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:len(ids)], abs=1e-6)


@pytest.mark.parametrize("body, words", [
    ({"prompt": [[1, 2], []]}, "the prompt is empty"),
    ({"prompt": [[1, 2], [3, "x"]]}, "a list of token-id lists"),
    ({"prompt": [1, 2, 3], "echo": True, "logprobs": 1, "prefill_tokens": 4},
     "prefill_tokens 4 is above the prompt's 3 tokens"),
    ({"prompt": [[1, 2], [3, 4]], "stream": True}, "a stream takes one prompt"),
])
def test_a_bad_prompt_or_split_is_refused_naming_it(clients, body, words):
    reply = clients("identity", {}).post("/v1/completions", json=body)
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
