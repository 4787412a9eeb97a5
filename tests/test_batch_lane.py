"""Packed blocks with room (kvbench.methods.core.room) and the batched step's lane for rows that
write into it (kvbench.models.batch_lane): what a reserving cache stores and reads is what a
plain one stores and reads, its steps write in place, its measured bytes count the room; and the
lane gives every row the logits the general way gives, bit for bit, on the tiny model."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the CPU fused attention needs numba (kvbench[torch])")

import kvbench.models.batch_step as batch_step  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.methods.core.codec_cache import CodecCache  # noqa: E402
from kvbench.methods.core.tail import ROOM_TOKENS  # noqa: E402
from kvbench.models.session import TorchSession, prefill  # noqa: E402
from tests.plugins.model_runs import staggered_prompts  # noqa: E402
from tests.plugins.tensors import randn  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# head_dim 16 on the tiny model
LAYOUTS = [("intq", {"bits": 4, "group_size": 16, "axis": "token"}),
           ("turbo", {"bits": 3, "block": 16}), ("lloydmax", {"bits": 3})]
IDS = [name for name, _ in LAYOUTS]


def _method(name: str, params: dict):
    return implementation(build_method(name, params))


def _filled(cache, reserve: int | None, steps: int, seed: int):
    """A layer cache of intq4 after a 40-token chunk and `steps` one-token appends."""
    if reserve is not None:
        cache.reserve(reserve)
    cache.append(randn(1, 2, 40, 64, seed=seed), randn(1, 2, 40, 64, seed=seed + 1))
    for step in range(steps):
        cache.append(randn(1, 2, 1, 64, seed=seed + 2 + 2 * step),
                     randn(1, 2, 1, 64, seed=seed + 3 + 2 * step))
    return cache


def _joining(method):
    """The method's layer cache that joins at every step (the DynamicCache-style baseline)."""
    return CodecCache(*method.layer_codecs, method.window, method.on.arrays, in_place=False)


def test_a_reserving_cache_stores_and_reads_what_a_plain_one_does_and_writes_in_place():
    method = _method("intq", {"bits": 4, "group_size": 32, "axis": "token"})
    plain = _filled(_joining(method), None, 9, seed=3)
    roomy = _filled(method.new_layer_cache(0), 60, 0, seed=3)
    codes = roomy.attention_segments().segments[0].keys["codes"]
    address = codes.untyped_storage().data_ptr()
    for step in range(9):
        roomy.append(randn(1, 2, 1, 64, seed=5 + 2 * step), randn(1, 2, 1, 64, seed=6 + 2 * step))
    # every step went where the block ends: the block never moved
    codes = roomy.attention_segments().segments[0].keys["codes"]
    assert codes.untyped_storage().data_ptr() == address and codes.shape[-2] == 49
    for got, want in zip(roomy.attention_inputs()[:2], plain.attention_inputs()[:2]):
        assert torch.equal(got, want)
    assert roomy.retained_bytes == plain.retained_bytes
    # the room is held: 11 more tokens of codes (32 B), scales and mins (2 fp16 each) per head
    per_token = 2 * 2 * (32 + 2 * 2 + 2 * 2)
    assert roomy.measured_bytes() - plain.measured_bytes() == 11 * per_token
    # told nothing, it keeps ROOM_TOKENS of room past its packed tokens all the same
    unreserved = _filled(method.new_layer_cache(0), None, 9, seed=3)
    assert torch.equal(unreserved.attention_inputs()[0], plain.attention_inputs()[0])
    assert unreserved.measured_bytes() - plain.measured_bytes() == (ROOM_TOKENS - 9) * per_token


def test_a_room_holds_the_reservation_and_a_full_room_moves_on():
    method = _method("intq", {"bits": 4, "group_size": 32, "axis": "token"})
    reserved = 41 + ROOM_TOKENS * 2
    cache = _filled(method.new_layer_cache(0), reserved, 0, seed=7)
    rooms = cache.step_rooms()
    assert rooms[0].capacity == reserved  # all it was told it will hold, made at the first pack
    steps = reserved - 40 + 1  # one past the reservation
    for step in range(steps):
        cache.append(randn(1, 2, 1, 64, seed=step), randn(1, 2, 1, 64, seed=step + 1))
    assert cache.step_rooms()[0] is not rooms[0]  # the full room was joined into a new one
    plain = method.new_layer_cache(0)
    plain.append(randn(1, 2, 40, 64, seed=7), randn(1, 2, 40, 64, seed=8))
    for step in range(steps):
        plain.append(randn(1, 2, 1, 64, seed=step), randn(1, 2, 1, 64, seed=step + 1))
    assert torch.equal(cache.attention_inputs()[0], plain.attention_inputs()[0])
    # past the reservation: ROOM_TOKENS more than it holds
    assert cache.step_rooms()[0].capacity == 40 + steps + ROOM_TOKENS


@pytest.fixture(scope="module")
def session(tiny_llama):
    return TorchSession(tiny_llama, torch.device("cpu"))


@pytest.fixture(scope="module")
def prompts(session):
    return staggered_prompts(session.tokenizer)


def _decode(session, method, prompts, steps: int, lane: bool, monkeypatch,
            reserve: list[int | None]) -> tuple[torch.Tensor, list[bool]]:
    """Every step's logits of the prompts decoded together, greedily, with the lane or without
    it; and whether each step took it."""
    took = []
    lane_step = batch_step.lane_step

    def watched(*args):
        read = lane_step(*args) if lane else None
        took.append(read is not None)
        return read

    monkeypatch.setattr(batch_step, "lane_step", watched)
    caches = []
    for prompt, room in zip(prompts, reserve):
        cache = session.new_cache(method)
        if room is not None:
            cache.reserve(len(prompt) + room)
        prefill(session, cache, prompt, method)
        caches.append(cache)
    ids, logits = [p[-1] for p in prompts], []
    for _ in range(steps):
        out = session.step_rows(ids, caches)
        logits.append(out)
        ids = out.argmax(-1).tolist()
    monkeypatch.undo()
    return torch.stack(logits), took


@pytest.mark.parametrize("reads", ["exact", "stored"])
@pytest.mark.parametrize("name,params", LAYOUTS, ids=IDS)
def test_the_lane_gives_every_row_the_general_ways_logits(session, prompts, name, params, reads,
                                                           monkeypatch):
    method = _method(name, {**params, "prefill_reads": reads})
    reserve = [12] * len(prompts)
    general, _ = _decode(session, method, prompts, 8, False, monkeypatch, reserve)
    laned, took = _decode(session, method, prompts, 8, True, monkeypatch, reserve)
    assert all(took)
    assert torch.equal(laned, general)


def test_a_step_with_a_row_that_has_no_room_goes_the_general_way(session, prompts, monkeypatch):
    method = _method(*LAYOUTS[0])
    reserve = [12, None, 12, 12, 3]  # one told nothing (room all the same); one whose room fills
    general, _ = _decode(session, method, prompts, 6, False, monkeypatch, reserve)
    laned, took = _decode(session, method, prompts, 6, True, monkeypatch, reserve)
    # the room of 3 is full at the fourth step, which goes the general way; its pack makes the
    # row a new room, so the steps after it take the lane again
    steps = len(took) // 6
    assert all(took[: 3 * steps]) and not any(took[3 * steps : 4 * steps])
    assert all(took[4 * steps :])
    assert torch.equal(laned, general)
