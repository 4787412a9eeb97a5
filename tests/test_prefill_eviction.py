"""streamingllm with evict every_chunk: room is made before every forward, prefill chunks
included, so the cache holds at most the budget and one chunk. Its prompt logits are the plain
model's under the mask of what each chunk could see (the sinks, the newest tokens kept, its own
tokens causally): the streaming semantics exactly, within float32 rounding."""
from __future__ import annotations

import pytest
import torch

from kvbench.methods import build_method, implementation
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


def test_the_cache_never_holds_more_than_the_budget_and_a_chunk(tiny_llama):
    session = TorchSession(tiny_llama, CPU)
    highs = {}
    for evict in ("end_prefill", "every_chunk"):
        method = implementation(build_method("streamingllm", {"budget": 10, "evict": evict}))
        cache = session.new_cache(method)
        seen = []
        prefill(session, cache, _ids(), method, chunk=CHUNK,
                after_chunk=lambda fed: seen.append(cache.measured_bytes()))
        highs[evict] = max(seen)
    per_token = highs["end_prefill"] // PROMPT  # the plain prompt's bytes, every token held
    assert highs["end_prefill"] == PROMPT * per_token
    assert highs["every_chunk"] == (SINKS + CHUNK) * per_token  # room made before each chunk


def test_a_ratio_without_the_prompt_length_is_refused(tiny_llama):
    session = TorchSession(tiny_llama, CPU)
    method = implementation(build_method("streamingllm", {"ratio": 0.25, "evict": "every_chunk"}))
    cache = session.new_cache(method)
    with pytest.raises(RuntimeError, match="needs the prompt's length before it is fed"):
        session.step(_ids()[:16], cache)
