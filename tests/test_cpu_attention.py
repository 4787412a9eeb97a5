"""The CPU fused decode attention over packed K/V (kvbench.kernels.cpu) against float64 attention
over the reference-decoded K/V, within the tolerances the Triton kernel meets: every covered
layout, GQA and MQA, odd lengths, hidden keys, many chunks; and in a model, where it is the
default read of impl "auto" on the CPU. Inputs are fresh seeded draws per case."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the CPU fused attention needs numba (kvbench[torch])")

from kvbench.kernels.cpu import attention, row_decode  # noqa: E402
from kvbench.kernels.formats import KVSegment  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from tests.plugins.model_runs import logits_by_read, rows_and_alone  # noqa: E402
from tests.plugins.tensors import (  # noqa: E402
    ATTENTION_TOLERANCE, decode_attention_inputs, exact_attention, randn,
)

CPU = torch.device("cpu")
# every layout the CPU kernel reads: bit widths 2, 3, 4 and 8; scale groups and turbo blocks of 8
# to 64 values; lloydmax's float32 norms and turbo's float16 ones
LAYOUTS = [("intq", {"bits": 4}), ("intq", {"bits": 2, "group_size": 16}),
           ("intq", {"bits": 8, "group_size": 8}), ("turbo3", {"block": 64}),
           ("turbo4", {"block": 32}), ("turbo2", {"block": 8}), ("lloydmax", {}),
           ("lloydmax", {"bits": 6}), (None, {})]


def _codec(name: str, params: dict):
    return implementation(build_method(name, {**params, "impl": "torch"})).codec()


@pytest.mark.parametrize("name,params", LAYOUTS, ids=[f"{n}-{p}" for n, p in LAYOUTS])
@pytest.mark.parametrize("dtype", list(ATTENTION_TOLERANCE), ids=str)
@pytest.mark.parametrize("shape", [(1, 4, 4, 33, 64), (2, 9, 3, 301, 128), (1, 8, 1, 1, 64)],
                         ids=["mha-33", "gqa3-301-batch2", "mqa8-1token"])
def test_matches_attention_over_the_decoded_cache(name, params, dtype, shape, monkeypatch):
    monkeypatch.setattr(attention, "MIN_CHUNK", 16)  # several chunks per head, merged
    codec = fmt = None
    if name is not None:
        codec = _codec(name, params)
        fmt = codec.kernel_format(shape[-1])
        assert fmt.cpu_attention_unsupported(shape[-1]) is None
    query, segments, all_k, all_v, bias = decode_attention_inputs(shape, dtype, codec, fmt)
    scaling = 0.7 * shape[-1] ** -0.5
    for b in (None, bias):
        out = attention.decode_attention(query, segments, bias=b, scaling=scaling)
        assert out.shape == query.shape and out.dtype == dtype
        exact = exact_attention(query, all_k, all_v, b, scaling)
        error = float((out.double() - exact).norm() / exact.norm())
        assert error < ATTENTION_TOLERANCE[dtype], (b is None, error)


@pytest.fixture
def without_avx2(monkeypatch):
    """Kernels built as on a CPU without AVX2 (codebooks looked up lane by lane), then again
    as this CPU builds them."""
    def rebuild():
        attention.kernels.cache_clear()
        row_decode.row_decoder.cache_clear()

    rebuild()
    monkeypatch.setattr(row_decode, "AVX2", False)
    yield
    monkeypatch.undo()
    rebuild()


@pytest.mark.parametrize("name,params", [("turbo3", {"block": 64}), ("turbo4", {"block": 32}),
                                         ("lloydmax", {"bits": 2})])
def test_codebooks_read_without_avx2(name, params, without_avx2):
    shape = (1, 6, 2, 45, 128)
    codec = _codec(name, params)
    fmt = codec.kernel_format(shape[-1])
    query, segments, all_k, all_v, _ = decode_attention_inputs(shape, torch.float32, codec, fmt)
    out = attention.decode_attention(query, segments)
    exact = exact_attention(query, all_k, all_v, None, shape[-1] ** -0.5)
    assert float((out.double() - exact).norm() / exact.norm()) \
        < ATTENTION_TOLERANCE[torch.float32]


def test_packed_chunks_in_order_with_a_long_odd_cache():
    """Two packed chunks then the tail, 1000 + 257 + 5 tokens: each token where it belongs."""
    codec = _codec("turbo3", {"block": 64})
    fmt = codec.kernel_format(64)
    parts = [(randn(1, 3, n, 64, seed=10 + n), randn(1, 3, n, 64, seed=20 + n))
             for n in (1000, 257)]
    tail = (randn(1, 3, 5, 64, seed=1), randn(1, 3, 5, 64, seed=2))
    segments, decoded_k, decoded_v = [], [], []
    for k, v in parts:
        pk, pv = codec.encode(k), codec.encode(v)
        segments.append(KVSegment(pk.tensors, pv.tensors, fmt, fmt))
        decoded_k.append(codec.decode(pk))
        decoded_v.append(codec.decode(pv))
    segments.append(KVSegment(*tail))
    query = randn(1, 9, 1, 64, seed=3)
    out = attention.decode_attention(query, segments)
    assert out.shape == (1, 9, 1, 64)
    exact = exact_attention(query[:, :, 0], torch.cat([*decoded_k, tail[0]], 2),
                            torch.cat([*decoded_v, tail[1]], 2), None, 64 ** -0.5)
    assert float((out[:, :, 0].double() - exact).norm() / exact.norm()) \
        < ATTENTION_TOLERANCE[torch.float32]


@pytest.mark.parametrize("name,params,dim,reason", [
    ("intq", {"bits": 4, "group_size": 4}, 64, "group_size 4 is not a multiple of 8"),
    ("intq", {"bits": 4}, 60, "head_dim 60 is not a multiple of 8"),
    ("kivi", {"bits": 2, "group_size": 4, "residual": 8}, 64,
     "group_size 4 is not a multiple of 8"),
])
def test_layouts_it_cannot_read_are_named(name, params, dim, reason):
    method = implementation(build_method(name, params))
    codec = method.key_codec() if name == "kivi" else method.codec()
    assert codec.kernel_format(dim).cpu_attention_unsupported(dim) == reason
    assert codec.attention_kernel(CPU, dim) is None


def test_bad_shapes_are_refused():
    keys = randn(1, 4, 10, 64, seed=2)
    with pytest.raises(ValueError, match="6 query heads do not share 4 KV heads"):
        attention.decode_attention(randn(1, 6, 64, seed=1), [KVSegment(keys, keys)])
    with pytest.raises(ValueError, match=r"bias must be \(batch, kv_heads, tokens\)"):
        attention.decode_attention(randn(1, 8, 64, seed=1), [KVSegment(keys, keys)],
                                   bias=torch.zeros(1, 4, 9))


# window 0 with stored reads: every token is read packed; a window keeps a raw tail; exact reads
# (the default) read each step's token as the model made it, the rest packed
@pytest.mark.parametrize("name,params", [
    ("intq", {"bits": 4, "group_size": 8, "prefill_reads": "stored"}),
    ("turbo3", {"block": 16, "prefill_reads": "stored"}),
    ("lloydmax", {"prefill_reads": "stored"}),
    ("intq", {"bits": 4, "group_size": 8, "window": 5}),
    ("intq", {"bits": 4, "group_size": 8}), ("turbo3", {"block": 16}), ("lloydmax", {})])
def test_a_model_decodes_through_it_by_default(name, params, tiny_llama):
    """impl "auto" on the CPU reads the packed cache with the CPU kernel at one-token steps: the
    same logits as the reference path (decode, then SDPA) within float32 rounding."""
    from kvbench.models.session import TorchSession

    session = TorchSession(tiny_llama, CPU)
    ids = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    logits, ran = logits_by_read(
        session, lambda impl: implementation(build_method(name, {**params, "impl": impl})), ids,
        30)
    assert ran == {"torch": {"torch"}, "auto": {"cpu"}}
    scale = logits["torch"].abs().max()
    assert (logits["auto"] - logits["torch"]).abs().max() < 1e-5 * scale


def test_without_numba_auto_reads_through_the_reference(monkeypatch):
    import kvbench.methods.torch.base as base

    monkeypatch.setattr(base, "numba_installed", lambda: False)
    codec = _codec("intq", {"bits": 4})
    codec.impl = "auto"
    assert codec.attention_kernel(CPU, 64) is None


def test_the_decode_attention_benchmark_times_it(tmp_path):
    """The decode_attention benchmark on the CPU reads the packed K/V with this kernel (identity's
    plain K/V too), records it, and its error is within float32 rounding."""
    from kvbench import load_suite, run_suite

    suite = tmp_path / "cpu_attention.yaml"
    suite.write_text("""kvbench: 1
defaults: {device: cpu}
methods:
  - {name: identity}
  - {name: intq, label: intq4, params: {bits: 4}}
benchmarks:
  - kind: decode_attention
    params: {context: 300, q_heads: 6, kv_heads: 2, head_dim: 64, dtype: float32, warmup: 1,
             copies: 2}
""")
    cases = {c.id: c for c in run_suite(load_suite(suite), tmp_path / "out").result.cases}
    assert all(c.status == "ok" for c in cases.values()), [c.error for c in cases.values()]
    packed = cases["decode_attention/intq4"]
    assert packed.info["impl"]["decode attention"] == "cpu"
    assert packed.metrics["rel_error"].value < ATTENTION_TOLERANCE[torch.float32]
    assert cases["decode_attention/identity"].metrics["rel_error"].value \
        < ATTENTION_TOLERANCE[torch.float32]
    assert len(packed.metrics["sdpa_vs_fused"].samples) == 1


def test_the_batched_step_reads_every_row_through_it(tiny_llama, monkeypatch):
    """The server's batched decode step (kvbench.models.batch_step) reads every row's packed
    cache with one call of the batched CPU kernel per layer: the logits of each row as its own
    one-token step's. Rows that keep no room (which the lane would write into instead:
    tests/test_batch_lane.py)."""
    from kvbench.kernels.cpu import batched
    from kvbench.methods.core.codec_cache import CodecMethod
    from kvbench.models.session import TorchSession

    monkeypatch.setattr(CodecMethod, "in_place", property(lambda self: False))

    calls, read_rows = [], batched.decode_attention_rows
    monkeypatch.setattr(batched, "decode_attention_rows",
                        lambda query, rows, scaling: calls.append(len(rows))
                        or read_rows(query, rows, scaling))

    session = TorchSession(tiny_llama, CPU)
    method = implementation(build_method("intq", {"bits": 4, "group_size": 8}))
    prompts = [list(range(5, 40)), list(range(60, 81))]  # rows of different lengths
    caches, alone = rows_and_alone(session, method, prompts, 7)
    method.impl_log.ran.clear()
    calls.clear()
    rows = session.step_rows([7, 7], caches)
    assert method.impl_log.ran["decode attention"] == {"cpu"}
    assert calls == [2] * session.num_layers
    for row, expected in zip(rows, alone):
        assert (row - expected).abs().max() < 1e-5 * expected.abs().max()
