"""The CPU fused decode attention over K/V quantized per channel over tokens (intq axis "channel",
kvbench.kernels.cpu.channel), KIVI's keys, against float64 attention over the reference-decoded
K/V within the tolerance every fused read meets; and KIVI in a model, where it is now the
default read of impl "auto" on the CPU. Inputs are fresh seeded draws per case."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the CPU fused attention needs numba (kvbench[torch])")

from kvbench.kernels.cpu import attention, batched, channel  # noqa: E402
from kvbench.kernels.formats import KVSegment  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from tests.plugins.model_runs import logits_by_read, rows_and_alone  # noqa: E402
from tests.plugins.tensors import ATTENTION_TOLERANCE, exact_attention, randn  # noqa: E402

CPU = torch.device("cpu")
TOLERANCE = ATTENTION_TOLERANCE[torch.float32]


def _codec(bits: int, group: int, axis: str):
    params = {"bits": bits, "group_size": group, "axis": axis, "impl": "torch"}
    return implementation(build_method("intq", params)).codec()


def _relative_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    return float((out.double() - exact).norm() / exact.norm())


# (bits, group, values' axis, (batch, q_heads, kv_heads, tokens, head_dim), tokens cut off the
# stored groups): kivi's default layout under GQA with a cut inside a group; MHA over whole
# groups with values per channel too; MQA; a head_dim not a multiple of 8
CASES = [(2, 32, "token", (2, 9, 3, 160, 64), 37), (4, 16, "channel", (1, 4, 4, 64, 64), 0),
         (8, 8, "token", (1, 8, 1, 96, 128), 1), (2, 8, "channel", (1, 6, 2, 32, 40), 11),
         (4, 8, "token", (1, 6, 2, 200, 64), 5)]


@pytest.mark.parametrize("bits,group,value_axis,shape,cut", CASES)
def test_matches_attention_over_the_decoded_cache(bits, group, value_axis, shape, cut,
                                                  monkeypatch):
    """Packed keys per channel (values per channel, or per token as KIVI's), read up to a token
    inside a group (`cut` tokens short), then a raw tail; with and without a bias that hides
    keys; several jobs per head."""
    monkeypatch.setattr(channel, "MIN_CHUNK", 8)
    batch, q_heads, kv_heads, tokens, dim = shape
    seed = tokens * 7 + bits * 3 + group + dim
    key_codec, value_codec = _codec(bits, group, "channel"), _codec(bits, group, value_axis)
    keys, values = randn(batch, kv_heads, tokens, dim, seed=seed), \
        randn(batch, kv_heads, tokens, dim, seed=seed + 1)
    tail = randn(batch, kv_heads, 3, dim, seed=seed + 2), randn(batch, kv_heads, 3, dim,
                                                                 seed=seed + 3)
    query = randn(batch, q_heads, dim, seed=seed + 4)
    pk, pv = key_codec.encode(keys), value_codec.encode(values)
    read = tokens - cut
    segments = [KVSegment(pk.tensors, pv.tensors, key_codec.kernel_format(dim),
                          value_codec.kernel_format(dim)).head(read), KVSegment(*tail)]
    all_k = torch.cat([key_codec.decode(pk)[:, :, :read], tail[0]], 2)
    all_v = torch.cat([value_codec.decode(pv)[:, :, :read], tail[1]], 2)
    bias = randn(batch, kv_heads, read + 3, seed=seed + 5)
    bias[..., ::5] = -float("inf")
    bias[..., -1] = 0.0
    for b in (None, bias):
        out = attention.decode_attention(query, segments, bias=b, scaling=0.8 * dim ** -0.5)
        exact = exact_attention(query, all_k, all_v, b, 0.8 * dim ** -0.5)
        assert _relative_error(out, exact) < TOLERANCE, b is None


def test_parallel_and_serial_kernels_agree():
    """On numba's threads (a big read) and on the caller's: the same scores, the same sums."""
    codec = _codec(4, 32, "channel")
    keys = randn(1, 4, 1024, 64, seed=5)
    packed = codec.encode(keys)
    side = channel.ChannelSide(packed.tensors, codec.kernel_format(64), 1000)
    q = randn(4, 3, 64, seed=6)
    weights = torch.softmax(randn(4, 3, 1000, seed=7), -1)
    scores = [torch.empty(4, 3, 1000) for _ in range(2)]
    sums = []
    for parallel, out in zip((False, True), scores):
        chunks, per = side.jobs(4)
        side.kernels[parallel][0](q.numpy(), *side.args, out.numpy(), 0, 1000, chunks, per)
        partial = torch.zeros(4, chunks, 3, 64)
        side.kernels[parallel][1](weights.numpy(), *side.args, partial.numpy(), 0, 1000, chunks,
                                  per)
        sums.append(partial.sum(1))
    decoded = codec.decode(packed)[:, :, :1000].reshape(4, 1000, 64)
    assert torch.allclose(scores[0], q @ decoded.transpose(1, 2), rtol=1e-5, atol=1e-4)
    assert torch.allclose(scores[0], scores[1], rtol=1e-6, atol=1e-6)
    assert torch.allclose(sums[0], weights @ decoded, rtol=1e-5, atol=1e-5)
    assert torch.allclose(sums[0], sums[1], rtol=1e-6, atol=1e-6)


def test_tokens_beyond_the_stored_groups_are_refused():
    codec = _codec(2, 32, "channel")
    packed = codec.encode(randn(1, 2, 64, 64, seed=1))
    with pytest.raises(ValueError, match="need 3 whole groups; the stored tensors hold 2"):
        channel.ChannelSide(packed.tensors, codec.kernel_format(64), 65)


def test_layouts_it_cannot_read_are_named():
    fmt = _codec(4, 4, "channel").kernel_format(64)
    assert fmt.cpu_attention_unsupported(64) == "group_size 4 is not a multiple of 8"
    assert _codec(4, 32, "channel").kernel_format(60).cpu_attention_unsupported(60) is None
    # the Triton kernel still reads no channel layout
    assert _codec(4, 32, "channel").kernel_format(64).attention_unsupported() \
        == "keys quantized per channel over tokens"


def _kivi(impl: str, **params):
    return implementation(build_method("kivi", {"group_size": 8, "residual": 16, **params,
                                                "impl": impl}))


@pytest.mark.parametrize("params", [{}, {"bits": 4, "residual": 0}])
def test_kivi_in_a_model_decodes_through_it_by_default(params, tiny_llama):
    """impl "auto" on the CPU reads KIVI's packed keys per channel, its values per token and the
    raw tokens with the CPU kernel at one-token steps: the logits of the reference path
    (decode, then SDPA) within float32 rounding carried through the steps, over steps that pack
    keys and values. (The paths may part over longer runs: keys packed from steps whose rounding
    differed can round to another code; the read itself is checked step by step below, at 2e-6.)
    A token read from the wrong place moves logits by ~1e-1."""
    from kvbench.models.session import TorchSession

    session = TorchSession(tiny_llama, CPU)
    ids = torch.randint(0, 200, (90,), generator=torch.Generator().manual_seed(8)).tolist()
    logits, ran = logits_by_read(session, lambda impl: _kivi(impl, **params), ids, 37)
    assert ran == {"torch": {"torch"}, "auto": {"cpu"}}
    scale = logits["torch"].abs().max()
    assert (logits["auto"] - logits["torch"]).abs().max() < 1e-4 * scale


@pytest.mark.parametrize("bits,group,residual", [(2, 8, 16), (4, 16, 32), (2, 8, 0),
                                                 (2, 32, 64)])
def test_kivi_reads_match_its_attention_inputs_at_every_step(bits, group, residual):
    """A 37-token prefill, then 70 one-token steps of fresh keys and values: at each, the fused
    read of the cache is attention over attention_inputs()' K/V within float32 rounding,
    whichever side is packed further and wherever the cuts fall in a group."""
    cache = _kivi("auto", bits=bits, group_size=group, residual=residual).new_layer_cache(0)
    seed = bits * 100 + group + residual
    cache.append(randn(1, 2, 37, 64, seed=seed), randn(1, 2, 37, 64, seed=seed + 1))
    cache.end_prefill()
    cuts = set()
    for step in range(70):
        cache.append(randn(1, 2, 1, 64, seed=seed + 2 + 2 * step),
                     randn(1, 2, 1, 64, seed=seed + 3 + 2 * step))
        read = cache.attention_segments()
        cuts.add((cache.keys.packed_tokens - cache.values.packed_tokens) % group)
        query = randn(1, 6, 64, seed=seed - step)
        want_k, want_v, _ = cache.attention_inputs()
        out = attention.decode_attention(query, read.segments)
        exact = exact_attention(query, want_k, want_v, None, 64 ** -0.5)
        assert _relative_error(out, exact) < TOLERANCE, step
    assert len(cuts) > 1  # cuts inside a group and on its edge were both read


def test_kivi_segments_cut_where_either_side_changes():
    """Keys packed in chunks of the residual, values once older than it: the segments cut at
    both boundaries, a per-channel block read from inside a group is decoded there, and the
    segments hold attention_inputs()' tokens in order."""
    method = _kivi("auto")
    cache = method.new_layer_cache(0)
    keys, values = randn(1, 2, 45, 64, seed=1), randn(1, 2, 45, 64, seed=2)
    cache.append(keys[:, :, :44], values[:, :, :44])
    cache.append(keys[:, :, 44:], values[:, :, 44:])  # packs keys to 32, values to 28
    assert (cache.keys.packed_tokens, cache.values.packed_tokens) == (32, 28)
    read = cache.attention_segments()
    assert read.kernel == "cpu"
    assert [s.tokens for s in read.segments] == [28, 4, 13]
    kinds = [(s.key_format is not None, s.value_format is not None) for s in read.segments]
    assert kinds == [(True, True), (False, False), (False, False)]
    query = randn(1, 6, 64, seed=3)
    want_k, want_v, _ = cache.attention_inputs()
    out = attention.decode_attention(query, read.segments)
    exact = exact_attention(query, want_k, want_v, None, 64 ** -0.5)
    assert _relative_error(out, exact) < TOLERANCE
    exact_read = cache.attention_segments((keys[:, :, 44:], values[:, :, 44:]))
    assert [s.tokens for s in exact_read.segments] == [28, 4, 12, 1]


def test_the_batched_step_reads_kivi_rows_one_by_one(tiny_llama):
    """The batched kernel takes per-token layouts only: a KIVI row is read by the one-row kernel,
    and each row's logits are its own one-token step's."""
    from kvbench.models.session import TorchSession

    session = TorchSession(tiny_llama, CPU)
    method = _kivi("auto")
    prompts = [list(range(5, 45)), list(range(60, 93))]
    caches, alone = rows_and_alone(session, method, prompts, 7)
    rows = session.step_rows([7, 7], caches)
    for row, expected in zip(rows, alone):
        assert (row - expected).abs().max() < 1e-5 * expected.abs().max()
    segments = caches[0].layers[0].policy.attention_segments().segments
    assert batched.batch_formats(segments) is None
