"""The ladder benchmark and the per-case peak-memory probe it stands on."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from kvbench.backends import process_memory
from kvbench.backends.torch_backend import reset_peak_memory
from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.ladder import Ladder, LadderParams
from kvbench.methods import OnBackend, implementation
from kvbench.methods.settings.identity import Identity
from kvbench.methods.torch.identity import TorchIdentity
from kvbench.models.session import TorchSession, prefill
from tests.plugins.model_runs import cpu_context

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MB = 1 << 20
needs_proc = pytest.mark.skipif(not process_memory.resettable(),
                                reason="the high-water mark resets only on Linux (/proc)")


@needs_proc
def test_cpu_peak_moves_by_what_is_allocated():
    """200 MB written after the reset raise the high-water mark by about 200 MB; after the next
    reset, freed memory is not counted again."""
    start = process_memory.reset_high_water()
    ballast = torch.ones(200 * MB // 4)  # float32: 200 MB, every page written
    grew = process_memory.high_water() - start
    del ballast
    start = process_memory.reset_high_water()
    idle = process_memory.high_water() - start
    assert 190 * MB < grew < 215 * MB
    assert idle < 10 * MB


@needs_proc
def test_what_only_a_reference_cycle_holds_is_not_counted_as_loaded():
    """An earlier case's cache kept alive only by a cycle is freed before `loaded` is read, as
    the automatic collector may not have run yet (it had not on CUDA: a 5.6 GiB cache)."""
    gc.disable()  # the collector must not run on its own between the two readings
    try:
        start = reset_peak_memory(torch.device("cpu"))
        cycle = [torch.ones(200 * MB // 4)]
        cycle.append(cycle)
        del cycle
        loaded = reset_peak_memory(torch.device("cpu"))
    finally:
        gc.enable()
    assert loaded - start < 20 * MB


def test_on_cuda_what_only_a_reference_cycle_holds_is_not_counted_as_loaded(monkeypatch):
    """The CUDA branch, with the allocator's counters faked: it collects first as well."""
    cycle = [torch.ones(4)]
    cycle.append(cycle)
    alive = weakref.ref(cycle[0])
    del cycle
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *args: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *args: int(alive() is not None))
    gc.disable()
    try:
        assert reset_peak_memory(torch.device("cuda")) == 0
    finally:
        gc.enable()


class _Ballast(TorchIdentity):
    """identity whose first layer also holds `mb` MB that no byte count knows about."""

    def __init__(self, mb: int = 200):
        super().__init__(Identity(), OnBackend("torch"))
        self.mb = mb

    def new_layer_cache(self, layer_idx):
        cache = super().new_layer_cache(layer_idx)
        if layer_idx == 0:
            cache.ballast = torch.ones(self.mb * MB // 4)
        return cache


@pytest.fixture(scope="module")
def ladder_runs(tiny_llama):
    ctx = cpu_context(loaded=tiny_llama)
    params = LadderParams(length=300, prefill_chunk=64, decode=4, calibration=0)
    ladder = measurement(Ladder)
    return {name: ladder.run(params, method, ctx)
            for name, method in (("identity", implementation(Identity())),
                                 ("ballast", _Ballast()))}


@needs_proc
def test_a_case_that_holds_200mb_more_reports_200mb_more_peak(ladder_runs):
    plain, ballast = (ladder_runs[n].metrics for n in ("identity", "ballast"))
    extra = ballast["peak_bytes"].value - plain["peak_bytes"].value
    assert 185 * MB < extra < 215 * MB
    # the case's own share: the same 200 MB over the footprint it started from
    extra_own = (ballast["peak_over_loaded_bytes"].value
                 - plain["peak_over_loaded_bytes"].value)
    assert 185 * MB < extra_own < 215 * MB
    # what no layout counts is in the peak only
    assert ballast["kv_bytes_measured"].value == plain["kv_bytes_measured"].value


def test_identity_rung_counts_the_plain_cache(ladder_runs, tiny_llama):
    out = ladder_runs["identity"]
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert set(m) == set(Ladder.metrics)
    # tiny:llama: 2 layers, 2 KV heads, head_dim 16, float32; 300 prompt + 4 decoded tokens
    plain = 2 * 2 * 2 * 16 * 4 * 304
    assert out.info["plain_kv_bytes"] == plain
    assert m["retained_kv_bytes"] == m["kv_bytes_measured"] == m["kv_high_water_bytes"] == plain
    assert m["retained_kv"] == 1
    weights = sum(p.numel() * 4 for p in tiny_llama.model.parameters())
    assert m["weights_bytes"] >= weights
    assert m["peak_bytes"] >= m["loaded_bytes"] + m["kv_bytes_measured"] or not (
        process_memory.resettable())
    assert m["e2e_s"] == pytest.approx(m["prefill_s"] + 4 / m["decode_tok_s"])
    assert len(out.info["generated"]) == 4
    assert out.info["beyond_trained_context"] is False


def test_token_methods_hold_every_token_until_end_prefill(tiny_llama):
    """The high-water mark tells logical from physical: streamingllm keeps 10% after
    end_prefill, but its cache held the whole prompt before it."""
    from kvbench.methods.settings.eviction import StreamingLLM

    ctx = cpu_context(loaded=tiny_llama)
    params = LadderParams(length=256, prefill_chunk=64, decode=2, calibration=0)
    out = measurement(Ladder).run(params, implementation(StreamingLLM(ratio=0.1)), ctx)
    m = {k: v.value for k, v in out.metrics.items()}
    assert m["retained_kv"] < 0.12
    # the whole prompt and the room reserved for its 2 decoded tokens, in place
    assert m["kv_high_water_bytes"] == 2 * 2 * 2 * 16 * 4 * (256 + 2)


def test_chunked_prefill_gives_the_one_forward_logits(tiny_llama):
    session = TorchSession(tiny_llama, torch.device("cpu"))
    ids = list(range(3, 103))
    identity = implementation(Identity())
    whole = prefill(session, session.new_cache(identity), ids, identity)[0]
    fed = []
    chunked = prefill(session, session.new_cache(identity), ids, identity, chunk=33,
                      after_chunk=fed.append)[0]
    assert fed == [33, 66, 99, 100]
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)


def test_a_short_text_is_repeated_and_said(tiny_llama, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("a few words, not many. " * 20)
    ctx = cpu_context(loaded=tiny_llama)
    params = LadderParams(length=1500, prefill_chunk=512, decode=1, calibration=0,
                          text=str(text))
    out = measurement(Ladder).run(params, implementation(Identity()), ctx)
    assert out.info["text_repeats"] >= 2
    assert out.metrics["retained_kv_bytes"].value == 2 * 2 * 2 * 16 * 4 * 1501


@pytest.mark.parametrize("bad, message", [
    ({"length": 1}, "length must be >= 2"),
    ({"prefill_chunk": 0}, "prefill_chunk must be >= 1"),
    ({"decode": 0}, "decode must be >= 1"),
])
def test_impossible_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        LadderParams(**bad)
