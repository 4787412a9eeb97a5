"""A batched decode step over packed caches: one CPU kernel call reads every row's cache
(kvbench.kernels.cpu.batched), against float64 attention over each row's reference-decoded K/V
within the tolerance of the one-row kernel, for rows of any lengths, GQA, raw tails or none and
exact reads' cut segments; a row's bits do not depend on the rows beside it. And one encode packs
every row's token (kvbench.methods.core.codec_cache.append_rows): each row stores the bytes its
own append stores. Inputs are fresh seeded draws per case."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the CPU fused attention needs numba (kvbench[torch])")

from kvbench.kernels.cpu import batched  # noqa: E402
from kvbench.kernels.formats import KVSegment  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.methods.core.codec_cache import append_rows  # noqa: E402
from tests.plugins.tensors import ATTENTION_TOLERANCE, exact_attention, randn  # noqa: E402

LAYOUTS = [("intq", {"bits": 4}), ("intq", {"bits": 2, "group_size": 16}),
           ("intq", {"bits": 8, "group_size": 8}), ("turbo3", {"block": 64}),
           ("turbo4", {"block": 32}), ("turbo2", {"block": 8}), ("lloydmax", {}),
           ("lloydmax", {"bits": 6})]
# (packed tokens, raw tokens, packed tokens cut off the end as an exact read cuts its newest)
ROWS = [(33, 3, 0), (1, 0, 0), (301, 1, 0), (9, 1, 1), (40, 17, 5)]
DIM = 64


def _codec(name: str, params: dict):
    return implementation(build_method(name, {**params, "impl": "torch"})).codec()


def _rows(key_codec, value_codec, kv_heads: int, seed: int):
    """Each row's segments (a packed one, maybe cut, then a raw tail or none) and its decoded
    keys and values."""
    key_fmt, value_fmt = (codec.kernel_format(DIM) for codec in (key_codec, value_codec))
    rows, decoded = [], []
    for i, (packed, raw, cut) in enumerate(ROWS):
        keys = randn(1, kv_heads, packed, DIM, seed=seed + 10 * i)
        values = randn(1, kv_heads, packed, DIM, seed=seed + 10 * i + 1)
        pk, pv = key_codec.encode(keys), value_codec.encode(values)
        segment = KVSegment(pk.tensors, pv.tensors, key_fmt, value_fmt)
        k, v = key_codec.decode(pk), value_codec.decode(pv)
        if cut:
            segment, k, v = segment.head(packed - cut), k[..., :-cut, :], v[..., :-cut, :]
        segments = [segment]
        if raw:
            tail = (randn(1, kv_heads, raw, DIM, seed=seed + 10 * i + 2),
                    randn(1, kv_heads, raw, DIM, seed=seed + 10 * i + 3))
            segments.append(KVSegment(*tail))
            k, v = torch.cat([k, tail[0]], 2), torch.cat([v, tail[1]], 2)
        assert batched.batch_formats(segments) == (key_fmt, value_fmt)
        rows.append(segments)
        decoded.append((k, v))
    return rows, decoded


def _check(query, rows, decoded, scaling):
    out = batched.decode_attention_rows(query, rows, scaling)
    assert out.shape == query.shape
    for i, (keys, values) in enumerate(decoded):
        exact = exact_attention(query[i : i + 1, :, 0], keys, values, None, scaling)
        error = float((out[i : i + 1, :, 0].double() - exact).norm() / exact.norm())
        assert error < ATTENTION_TOLERANCE[torch.float32], (i, error)
    return out


# every layout with GQA as the bundled model has it; MHA and MQA for one intq and one turbo
CASES = [(name, params, 3, 3) for name, params in LAYOUTS] + [
    (name, params, kv_heads, group) for name, params in (("intq", {"bits": 4}),
                                                         ("turbo3", {"block": 64}))
    for kv_heads, group in ((4, 1), (1, 8))]


@pytest.mark.parametrize("name,params,kv_heads,group", CASES,
                         ids=[f"{n}-{p}-{k}x{g}" for n, p, k, g in CASES])
def test_every_row_matches_attention_over_its_decoded_cache(name, params, kv_heads, group):
    codec = _codec(name, params)
    rows, decoded = _rows(codec, codec, kv_heads, seed=kv_heads * 100 + group)
    query = randn(len(ROWS), kv_heads * group, 1, DIM, seed=kv_heads + group)
    _check(query, rows, decoded, 0.7 * DIM ** -0.5)


def test_keys_and_values_of_different_layouts():
    key_codec, value_codec = _codec("intq", {"bits": 4}), _codec("turbo3", {"block": 32})
    rows, decoded = _rows(key_codec, value_codec, 2, seed=7)
    _check(randn(len(ROWS), 6, 1, DIM, seed=8), rows, decoded, DIM ** -0.5)


@pytest.mark.parametrize("name,params", [("intq", {"bits": 4}), ("turbo3", {"block": 64})])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(name, params, monkeypatch):
    """Alone or among others, on the caller's thread or numba's: the same bits."""
    codec = _codec(name, params)
    rows, decoded = _rows(codec, codec, 3, seed=3)
    query = randn(len(ROWS), 9, 1, DIM, seed=4)
    together = _check(query, rows, decoded, DIM ** -0.5)
    for i in range(len(ROWS)):
        alone = batched.decode_attention_rows(query[i : i + 1], rows[i : i + 1], DIM ** -0.5)
        assert torch.equal(alone, together[i : i + 1])
    monkeypatch.setattr(batched, "PARALLEL_ROWS", 0)
    assert torch.equal(batched.decode_attention_rows(query, rows, DIM ** -0.5), together)


def test_rows_it_cannot_read_go_elsewhere():
    codec = _codec("intq", {"bits": 4})
    fmt = codec.kernel_format(DIM)
    pk = codec.encode(randn(1, 2, 5, DIM, seed=1))
    packed = KVSegment(pk.tensors, pk.tensors, fmt, fmt)
    raw = KVSegment(randn(1, 2, 3, DIM, seed=2), randn(1, 2, 3, DIM, seed=3))
    assert batched.batch_formats([raw]) is None  # nothing packed yet
    assert batched.batch_formats([packed, raw, raw]) is None
    half = KVSegment(raw.keys.half(), raw.values.half())
    assert batched.batch_formats([packed, half]) is None  # the raw tail of a 16-bit model


# chunk_separable codecs pack every row at once; lloydmax's rotation (a matrix product) and a
# window (tokens leave it in blocks) go their own ways
@pytest.mark.parametrize("name,params", [
    ("intq", {"bits": 4}), ("intq", {"bits": 2, "axis": "channel", "group_size": 8}),
    ("turbo3", {"block": 64}), ("lloydmax", {}), ("lloydmax", {"rotate": True}),
    ("intq", {"bits": 4, "window": 3}), ("identity", {})])
def test_one_encode_packs_each_row_as_its_own_append(name, params):
    method = implementation(build_method(name, params))
    lengths = [5, 12, 1, 30]
    together = [method.new_layer_cache(0) for _ in lengths]
    apart = [method.new_layer_cache(0) for _ in lengths]
    for i, n in enumerate(lengths):
        keys, values = randn(1, 3, n, DIM, seed=i), randn(1, 3, n, DIM, seed=50 + i)
        together[i].append(keys, values)
        apart[i].append(keys, values)
    for step in range(9):
        keys = randn(len(lengths), 3, 1, DIM, seed=100 + step)
        values = randn(len(lengths), 3, 1, DIM, seed=200 + step)
        append_rows(together, keys, values)
        for i, policy in enumerate(apart):
            policy.append(keys[i : i + 1], values[i : i + 1])
    for mine, own in zip(together, apart):
        assert mine.retained_bytes == own.retained_bytes
        assert mine.measured_bytes() == own.measured_bytes()  # no views of the shared encode
        for a, b in zip(mine.attention_inputs()[:2], own.attention_inputs()[:2]):
            assert torch.equal(a, b)
