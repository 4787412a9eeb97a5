"""Eviction while the prompt is fed (evict every_chunk). streamingllm makes room before every
forward, prefill chunks included, so the cache holds at most the budget and one chunk; its prompt
logits are the plain model's under the mask of what each chunk could see (the sinks, the newest
tokens kept, its own tokens causally): the streaming semantics exactly, within float32 rounding.
h2o and snapkv reduce after every forward's attention: h2o as over decode steps, snapkv as
FINCH, one-shot SnapKV over what it kept and each chunk."""
from __future__ import annotations

import pytest
import torch

from kvbench.methods import build_method, implementation
from kvbench.methods.core.tail import ROOM_TOKENS
from kvbench.models.session import TorchSession, prefill

CPU = torch.device("cpu")
PROMPT, CHUNK, SINKS = 70, 16, 4


def _ids() -> list[int]:
    return torch.randint(0, 200, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()


def _streaming_mask(budget: int) -> torch.Tensor:
    """(T, T) additive mask: what each prompt token attends to when fed in CHUNK-token forwards
    with room made for each forward first (the sinks and the newest budget - forward tokens)."""
    mask = torch.full((PROMPT, PROMPT), float("-inf"))
    for start in range(0, PROMPT, CHUNK):
        n = min(CHUNK, PROMPT - start)
        room = max(budget - n, SINKS)
        kept = (list(range(start)) if start <= room
                else list(range(SINKS)) + list(range(start - (room - SINKS), start)))
        for i in range(start, start + n):
            mask[i, kept] = 0.0
            mask[i, start:i + 1] = 0.0
    return mask


@pytest.mark.parametrize("params,budget", [({"budget": 24}, 24), ({"ratio": 0.25}, 18)])
def test_prompt_logits_are_the_streaming_masks(tiny_llama, params, budget):
    session = TorchSession(tiny_llama, CPU)
    method = implementation(build_method("streamingllm", {**params, "evict": "every_chunk"}))
    assert not method.shares_prefill
    cache = session.new_cache(method)
    held = []
    logits = prefill(session, cache, _ids(), method, chunk=CHUNK,
                     after_chunk=lambda fed: held.append(max(cache.retained_tokens())))[0]
    with torch.inference_mode():
        reference = tiny_llama.model(torch.tensor([_ids()]),
                                     attention_mask=_streaming_mask(budget)[None, None])
    expected = reference.logits[0, -1]
    assert (logits[0] - expected).abs().max() < 1e-5 * expected.abs().max()
    # a forward brings its chunk after room is made: the sinks and the chunk at least
    assert max(held) == max(budget, SINKS + CHUNK)
    assert cache.retained_tokens() == [budget] * session.num_layers
    # the same settings reducing at end_prefill read the whole prompt: other logits
    whole = implementation(build_method("streamingllm", params))
    assert whole.shares_prefill
    other = prefill(session, session.new_cache(whole), _ids(), whole, chunk=CHUNK)[0]
    assert (other[0] - expected).abs().max() > 1e-2 * expected.abs().max()


def test_making_room_mid_prefill_attends_through_sdpa(tiny_llama, monkeypatch):
    """streamingllm's own causal mask goes to SDPA, which never holds a chunk's float32
    attention weights (they set the ladder's peak at 32k): the float32 path is not taken."""
    import kvbench.models.attention as attention

    def refuse(*args, **kwargs):
        raise AssertionError("streamingllm's mask took the float32 attention")

    monkeypatch.setattr(attention, "biased_attention", refuse)
    session = TorchSession(tiny_llama, CPU)
    method = implementation(build_method("streamingllm", {"budget": 24, "evict": "every_chunk"}))
    prefill(session, session.new_cache(method), _ids(), method, chunk=CHUNK)


def test_the_cache_never_holds_more_than_the_budget_and_a_chunk(tiny_llama):
    """Its tokens (accounted_bytes); the arrays holding them (measured_bytes) keep room for
    ROOM_TOKENS more, or for what the sequence was said to hold (reserve)."""
    session = TorchSession(tiny_llama, CPU)
    highs, measured = {}, {}
    for evict in ("end_prefill", "every_chunk"):
        method = implementation(build_method("streamingllm", {"budget": 10, "evict": evict}))
        cache = session.new_cache(method)
        session.reserve(cache, PROMPT)
        seen = []
        prefill(session, cache, _ids(), method, chunk=CHUNK,
                after_chunk=lambda fed: seen.append((cache.accounted_bytes(),
                                                     cache.measured_bytes())))
        highs[evict], measured[evict] = max(a for a, _ in seen), max(m for _, m in seen)
    per_token = highs["end_prefill"] // PROMPT  # the plain prompt's bytes, every token held
    assert highs["end_prefill"] == measured["end_prefill"] == PROMPT * per_token
    assert highs["every_chunk"] == (SINKS + CHUNK) * per_token  # room made before each chunk
    # once tokens are dropped the reservation no longer holds: room for the next steps only
    assert measured["every_chunk"] <= (SINKS + CHUNK + ROOM_TOKENS) * per_token


@pytest.mark.parametrize("budget", [{"budget": 10}, {"ratio": 0.143}])  # 10 of 70 tokens
@pytest.mark.parametrize("name", ["snapkv", "h2o"])
def test_scorers_evicting_every_chunk_hold_the_budget_after_every_forward(tiny_llama, name,
                                                                           budget):
    """snapkv and h2o reduce after each forward's attention: between forwards the cache holds
    the budget (during one, the budget and that chunk); at end_prefill, every prompt token."""
    session = TorchSession(tiny_llama, CPU)
    held = {}
    for evict in ("end_prefill", "every_chunk"):
        window = {"window": 4} if name == "snapkv" else {}
        method = implementation(build_method(name, {**budget, "evict": evict, **window}))
        cache = session.new_cache(method)
        seen = []
        prefill(session, cache, _ids(), method, chunk=CHUNK,
                after_chunk=lambda fed: seen.append(max(cache.retained_tokens())))
        held[evict] = seen
    assert held["end_prefill"] == [min(fed, PROMPT) for fed in range(CHUNK, PROMPT + CHUNK, CHUNK)]
    assert held["every_chunk"] == [10] * len(held["end_prefill"])


@pytest.mark.parametrize("name", ["streamingllm", "snapkv", "h2o"])
def test_a_ratio_without_the_prompt_length_is_refused(tiny_llama, name):
    session = TorchSession(tiny_llama, CPU)
    method = implementation(build_method(name, {"ratio": 0.25, "evict": "every_chunk"}))
    cache = session.new_cache(method)
    with pytest.raises(RuntimeError, match="needs the prompt's length before it is fed"):
        session.step(_ids()[:16], cache)


def test_h2o_evicting_every_chunk_is_h2o_stepping_through_the_prompt(tiny_llama):
    """H2O's greedy policy runs step by step and a chunk is a step of many tokens: every_chunk
    over the prompt equals h2o fed the first chunk as its prompt and the rest as decode steps."""
    session, ids = TorchSession(tiny_llama, CPU), _ids()
    chunked = implementation(build_method("h2o", {"budget": 10, "evict": "every_chunk"}))
    assert not chunked.shares_prefill
    cache = session.new_cache(chunked)
    logits = prefill(session, cache, ids, chunked, chunk=CHUNK)[0]
    stepped = implementation(build_method("h2o", {"budget": 10}))
    reference = session.new_cache(stepped)
    prefill(session, reference, ids[:CHUNK], stepped)
    for start in range(CHUNK, PROMPT, CHUNK):
        expected = session.step(ids[start : start + CHUNK], reference, last_only=True)[0]
    assert torch.equal(logits, expected)
    for mine, theirs in zip(cache.policies, reference.policies, strict=True):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    # reducing at end_prefill instead, every prompt token was read: other logits
    whole = implementation(build_method("h2o", {"budget": 10}))
    other = prefill(session, session.new_cache(whole), ids, whole, chunk=CHUNK)[0]
    assert (other - expected).abs().max() > 1e-2 * expected.abs().max()


def test_snapkv_every_chunk_keeps_what_snapkv_keeps_of_its_cache_and_each_chunk():
    """FINCH's scheme: after each chunk the cache is what one-shot SnapKV keeps of the tokens
    kept so far and the chunk, voted by the chunk's own last queries."""
    budget, window, heads, query_heads, dim = 12, 4, 3, 6, 8
    chunked = implementation(build_method(
        "snapkv", {"budget": budget, "window": window, "evict": "every_chunk"})).new_layer_cache(0)
    chunked.begin_prompt(PROMPT)
    one_shot = implementation(build_method("snapkv", {"budget": budget, "window": window}))
    generator = torch.Generator().manual_seed(3)
    kept_keys = kept_values = None
    for start in range(0, PROMPT, CHUNK):
        n = min(CHUNK, PROMPT - start)
        keys, values = (torch.randn(1, heads, n, dim, generator=generator) for _ in range(2))
        queries = torch.randn(1, query_heads, n, dim, generator=generator)
        chunked.append(keys, values)
        chunked.observe_queries(queries)
        if kept_keys is not None:
            keys, values = torch.cat([kept_keys, keys], -2), torch.cat([kept_values, values], -2)
        if keys.shape[-2] > budget:
            fresh = one_shot.new_layer_cache(0)
            fresh.append(keys, values)
            fresh.observe_queries(queries)
            fresh.end_prefill()
            keys, values = fresh.keys, fresh.values
        kept_keys, kept_values = keys, values
        assert torch.equal(chunked.keys, kept_keys) and torch.equal(chunked.values, kept_values)
    assert chunked.retained_tokens == budget and chunked.seen_tokens == PROMPT
