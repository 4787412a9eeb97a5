"""kvbench serve's prefix cache: a prompt that begins with whole prefill chunks of an earlier one
starts from a copy of their cache and prefills only the rest, and every method's answer (tokens
and logprobs) is bit for bit the answer without it; methods whose prefix depends on the whole
prompt are refused. On the tiny model, the engine in process."""
import threading

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import torch  # noqa: E402 - after the skip

from kvbench.methods import build_method, implementation
from kvbench.models.session import TorchSession, prefill
from kvbench.serve.engine import Engine
from kvbench.serve.events import Finished, Scored, Token
from kvbench.serve.request import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHUNK = 16
# Every kind of policy that fits the tiny model (head_dim 16): quantizers (torch and the
# default impl), eviction at end_prefill, query observers, a bias, block summaries, requantizing.
METHODS = [
    ("identity", {}),
    ("turbo", {"bits": 3, "block": 16}),
    ("kivi", {"bits": 2, "group_size": 16, "residual": 16}),
    ("intq", {"bits": 4, "group_size": 16, "axis": "token", "impl": "torch"}),
    ("streamingllm", {"ratio": 0.3}),
    ("snapkv", {"budget": 24, "window": 8}),
    ("h2o", {"ratio": 0.3}),
    ("am", {"ratio": 0.5}),
    ("butterfly", {"block_size": 16, "window": 8}),
    ("decay", {"base_params": {"block": 16}, "window": 16, "segment": 16}),
]


@pytest.fixture(scope="module")
def session(tiny_llama):
    return TorchSession(tiny_llama, torch.device("cpu"))


@pytest.fixture(scope="module")
def prompts(session):
    """A shared 40-token prefix (two whole chunks and a part), then each prompt's own words."""
    words = session.tokenizer.encode("the cache keeps keys and values of each token " * 8)
    shared = words[:40]
    return [shared + session.tokenizer.encode(f" question {i}: what is {i} times {i}?")
            for i in range(3)]


class Answer:
    def __init__(self):
        self.tokens, self.prompt_scores, self.end, self.done = [], None, None, threading.Event()

    def __call__(self, event):
        if isinstance(event, Token):
            self.tokens.append((event.id, event.logprob, event.top))
        elif isinstance(event, Scored):
            self.prompt_scores = [(t.id, t.logprob) for t in event.tokens]
        else:
            self.end = event
            self.done.set()


def answers(method, session, prompts, prefix_cache: int, max_tokens: int = 6,
            score_prompt: bool = False) -> tuple[list[Answer], Engine]:
    """Each prompt answered one after another by an engine with `prefix_cache` entries."""
    engine = Engine(session, implementation(build_method(*method)), prefill_chunk=CHUNK,
                    prefix_cache=prefix_cache)
    engine.start()
    out = []
    try:
        for prompt in prompts:
            answer = Answer()
            engine.submit(Request(list(prompt), max_tokens, answer, logprobs=3, ignore_eos=True,
                                  score_prompt=score_prompt))
            assert answer.done.wait(60)
            out.append(answer)
    finally:
        engine.stop()
    return out, engine


@pytest.mark.parametrize("method", METHODS, ids=[name for name, _ in METHODS])
def test_a_shared_prefix_is_prefilled_once_and_changes_no_answer(session, prompts, method):
    cold, _ = answers(method, session, prompts, prefix_cache=0)
    warm, engine = answers(method, session, prompts, prefix_cache=4)
    assert [a.end for a in warm] == [Finished("length", len(p), 6) for p in prompts]
    assert [a.tokens for a in warm] == [a.tokens for a in cold]  # ids, logprobs, top: exact
    state = engine.state()
    # the first prompt stored its whole chunks; the others started from the last one they share
    shared = common_prefix(prompts) // CHUNK * CHUNK
    assert shared >= 2 * CHUNK
    assert state["prefix_cache_hits"] == 2 and state["prefix_cache_misses"] == 1
    assert state["prefix_cache_reused_tokens"] == 2 * shared
    assert engine.totals.prompt_tokens == sum(map(len, prompts)) - 2 * shared


def common_prefix(prompts) -> int:
    length = 0
    while all(len(p) > length and p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length


def test_a_conversation_goes_on_from_its_earlier_turns(session, prompts):
    """Turn 2 is turn 1's prompt, its answer and a new question: turn 1's chunks are reused."""
    method = METHODS[3]
    first, _ = answers(method, session, prompts[:1], prefix_cache=0)
    said = [token for token, _, _ in first[0].tokens]
    turns = [prompts[0], prompts[0] + said + session.tokenizer.encode(" and then?")]
    cold, _ = answers(method, session, turns, prefix_cache=0, max_tokens=12)
    warm, engine = answers(method, session, turns, prefix_cache=4, max_tokens=12)
    assert [a.tokens for a in warm] == [a.tokens for a in cold]
    whole = len(turns[0]) // CHUNK * CHUNK  # turn 1's whole chunks
    assert engine.state()["prefix_cache_reused_tokens"] == whole


def test_a_scored_prompt_is_prefilled_whole(session, prompts):
    """Echoed prompt logprobs need every prompt position's logits: no reuse, same scores."""
    cold, _ = answers(METHODS[0], session, prompts[:2], prefix_cache=0, score_prompt=True)
    warm, engine = answers(METHODS[0], session, prompts[:2], prefix_cache=4, score_prompt=True)
    assert [a.prompt_scores for a in warm] == [a.prompt_scores for a in cold]
    assert engine.state()["prefix_cache_hits"] == 0
    assert engine.totals.prompt_tokens == len(prompts[0]) + len(prompts[1])


def test_the_least_recently_used_prefix_goes_first(session, prompts):
    _, engine = answers(METHODS[0], session, prompts[:1], prefix_cache=1)
    state = engine.state()
    assert state["prefix_cache_entries"] == 1  # chunk 1 was stored, then dropped for chunk 2
    assert state["prefix_cache_bytes"] > 0


@pytest.mark.parametrize("method", [("streamingllm", {"ratio": 0.3, "evict": "every_chunk"}),
                                    ("kvpress", {"press": "SnapKVPress",
                                                 "compression_ratio": 0.5})],
                         ids=["evicts-while-fed", "one-forward"])
def test_a_method_whose_prefix_depends_on_the_whole_prompt_is_refused(session, method):
    if method[0] == "kvpress":
        require_extra("kvpress")
    with pytest.raises(ValueError, match="--prefix-cache"):
        Engine(session, implementation(build_method(*method)), prefix_cache=4)


def test_prefill_refuses_a_done_count_that_is_not_whole_chunks(session, prompts):
    method = implementation(build_method("identity", {}))
    with pytest.raises(ValueError, match="whole number of chunks"):
        prefill(session, session.new_cache(method), prompts[0], method, chunk=CHUNK, done=10)


def test_a_chat_conversation_reuses_its_earlier_turns_over_http(session):
    """Turn 2 sends turn 1's messages, its reply and a new question: the chat template renders
    turn 1's prompt again at its start, so its whole chunks come from the prefix cache."""
    from fastapi.testclient import TestClient

    from kvbench.serve.app import create_app

    engine = Engine(session, implementation(build_method(*METHODS[3])), prefill_chunk=CHUNK,
                    prefix_cache=4)
    engine.start()
    try:
        client = TestClient(create_app(engine, "tiny:llama", "intq", session.loaded.max_context))
        messages = [{"role": "system", "content": "You answer questions about caches. " * 3},
                    {"role": "user", "content": "What does the cache keep?"}]
        first = client.post("/v1/chat/completions", json={"messages": messages,
                                                            "max_tokens": 8, "temperature": 0})
        assert first.status_code == 200, first.text
        reply = first.json()["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And what does it drop?"}]
        second = client.post("/v1/chat/completions", json={"messages": messages,
                                                             "max_tokens": 8, "temperature": 0})
        assert second.status_code == 200, second.text
        kept = client.get("/health").json()["prefix_cache"]
    finally:
        engine.stop()
    turn_1 = first.json()["usage"]["prompt_tokens"]
    assert kept["prefix_cache_hits"] == 1
    assert kept["prefix_cache_reused_tokens"] == turn_1 // CHUNK * CHUNK > 0
