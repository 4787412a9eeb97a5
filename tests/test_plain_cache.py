"""The plain cache written in place (kvbench.methods.core.tail): identity's default storage keeps
its tokens in a buffer with room and hands attention views of it; `storage: concat` joins at
every step, as transformers' DynamicCache does. Both give the model's own logits bit for bit,
and the buffer is written where it is, never copied at a step that fits."""
from __future__ import annotations

import pytest
import torch

from kvbench.methods import build_method, implementation
from kvbench.methods.core.tail import ROOM_TOKENS, Tail
from kvbench.backends.torch_arrays import TORCH_ARRAYS
from tests.plugins.tensors import randn

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _identity(**params):
    return implementation(build_method("identity", params))


def _decode(session, cache, ids: list[int], prompt: int) -> torch.Tensor:
    logits = [session.step(ids[:prompt], cache)[0]]
    logits += [session.step([token], cache)[0] for token in ids[prompt:]]
    return torch.cat(logits)


@pytest.mark.parametrize("reserve", [None, 240])
def test_the_buffer_gives_the_joined_caches_and_the_models_own_logits_bit_for_bit(
        tiny_llama, reserve):
    from kvbench.models.session import TorchSession

    session = TorchSession(tiny_llama, torch.device("cpu"))
    ids = torch.randint(0, 200, (230,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = _decode(session, session.new_cache(None), ids, 40)  # transformers' DynamicCache
    joined = session.new_cache(_identity(storage="concat"))
    assert torch.equal(_decode(session, joined, ids, 40), plain)
    buffered = session.new_cache(_identity())
    if reserve:
        session.reserve(buffered, reserve)
    assert torch.equal(_decode(session, buffered, ids, 40), plain)
    assert buffered.accounted_bytes() == joined.accounted_bytes() == joined.measured_bytes()
    # it holds the reservation, or ROOM_TOKENS past the prompt (the 230 tokens fit there)
    per_token = joined.measured_bytes() // len(ids)
    assert buffered.measured_bytes() == (reserve or 40 + ROOM_TOKENS) * per_token


def test_a_step_that_fits_writes_in_place_and_a_full_buffer_grows_by_its_room():
    tail = Tail(TORCH_ARRAYS)
    tail.extend(randn(1, 2, 10, 8, seed=1), reserved=0)
    buffer = tail.held
    assert buffer.shape[-2] == 10 + ROOM_TOKENS
    steps = [randn(1, 2, 1, 8, seed=2 + i) for i in range(ROOM_TOKENS)]
    for step in steps:
        tail.extend(step)
    assert tail.held is buffer and tail.tokens == 10 + ROOM_TOKENS
    tail.extend(randn(1, 2, 3, 8, seed=99))
    assert tail.held is not buffer and tail.held.shape[-2] == 13 + 2 * ROOM_TOKENS
    expected = torch.cat([randn(1, 2, 10, 8, seed=1), *steps, randn(1, 2, 3, 8, seed=99)], -2)
    assert torch.equal(tail.array, expected)
    tail.trim(4)
    tail.extend(randn(1, 2, 1, 8, seed=5))
    assert torch.equal(tail.array, torch.cat([expected[..., :-4, :], randn(1, 2, 1, 8, seed=5)],
                                             -2))


def test_the_front_taken_is_a_copy_the_buffer_can_be_written_over():
    tail = Tail(TORCH_ARRAYS)
    x = randn(1, 2, 6, 8, seed=3)
    tail.extend(x)
    front = tail.take_front(4)
    tail.extend(randn(1, 2, 5, 8, seed=4))
    assert torch.equal(front, x[..., :4, :])
    assert torch.equal(tail.array, torch.cat([x[..., 4:, :], randn(1, 2, 5, 8, seed=4)], -2))


def test_joining_holds_exactly_its_tokens():
    tail = Tail(TORCH_ARRAYS, in_place=False)
    for i in range(3):
        tail.extend(randn(1, 2, 2, 8, seed=i))
    assert tail.held.shape[-2] == tail.tokens == 6 and not tail.buffered


def test_attention_reads_the_buffer_in_place_not_a_copy_of_the_whole_layer():
    """A prefill chunk's read of identity's cache was a copy of the layer's K and V (a lone part
    joined all the same): half the plain cache of a 2-layer model at once, growing with the
    context. Now two reads share the buffer, which holds the reservation past the tokens."""
    layer = _identity().new_layer_cache(0)
    layer.reserve(96)
    chunks = [(randn(1, 2, 32, 8, seed=2 * i), randn(1, 2, 32, 8, seed=2 * i + 1))
              for i in range(3)]
    for keys, values in chunks:
        layer.append(keys, values)
        first, second = layer.attention_inputs()[:2], layer.attention_inputs()[:2]
        for a, b in zip(first, second):
            assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            assert a.untyped_storage().nbytes() == 96 * 2 * 8 * 4  # the buffer, not the view
    assert torch.equal(first[0], torch.cat([k for k, _ in chunks], -2))
    assert torch.equal(first[1], torch.cat([v for _, v in chunks], -2))
