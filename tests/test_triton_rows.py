"""The Triton fused decode attention over a batched step's rows (kvbench.kernels.triton.rows):
each row its own cache (its own allocations, a packed block read as a view of a bigger room, the
step's raw token), rows of different lengths. Row i's output must be decode_attention's over
row i alone, bit for bit, and float64 attention's over the reference-decoded cache within the
dtype's rounding; the launches must not grow with the rows. Without CUDA in Triton's
interpreter (tests/conftest.py).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kvbench.kernels.formats import IntQFormat, KVSegment, token_axis  # noqa: E402
from kvbench.kernels.triton import attention  # noqa: E402
from kvbench.kernels.triton.segments import decode_attention  # noqa: E402
from kvbench.kernels.triton.rows import (  # noqa: E402
    LINE, decode_attention_rows, row_formats,
)
from kvbench.methods import build_method, implementation  # noqa: E402
from tests.plugins.tensors import ATTENTION_TOLERANCE, exact_attention, randn  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
METHODS = {"raw": None, "intq4": ("intq", {"bits": 4}), "turbo3": ("turbo3", {"block": 32}),
           "lloydmax": ("lloydmax", {})}
LENGTHS = (1, 33, 70, 300)  # the rows' packed blocks; each row reads one more, its step token


@pytest.fixture(autouse=True)
def one_tile_configuration(monkeypatch):
    """As tests/test_kernels.py: on a GPU one tile, not the autotuning."""
    if DEVICE.type == "cuda":
        monkeypatch.setattr(attention, "_SPLIT", attention._split)
        monkeypatch.setattr(attention, "_TILE", {"BLOCK_N": 32, "SELECT": False,
                                                 "num_warps": 4, "num_stages": 2})


def _codecs(method: str):
    """(kernel codec, its kernel format, reference codec) of a method; Nones for raw."""
    if METHODS[method] is None:
        return None, None, None
    name, params = METHODS[method]
    codec = implementation(build_method(name, {**params, "impl": "triton"})).codec()
    reference = implementation(build_method(name, {**params, "impl": "torch"})).codec()
    return codec, codec.kernel_for(DEVICE, 64), reference


def _in_room(t: torch.Tensor, axis: int, batch: int, narrow: bool) -> torch.Tensor:
    """t (batch 1) as the first tokens of sequence `batch` of a room with 2 sequences and 20
    more tokens, filled with garbage: a view of them (narrow) or of the whole room's sequence
    (for KVSegment.head), read in place."""
    size = list(t.shape)
    size[0], size[axis] = 2, size[axis] + 20
    room = torch.full(size, 255 if t.dtype == torch.uint8 else float("nan"), dtype=t.dtype,
                      device=t.device)[batch : batch + 1]
    room.narrow(axis, 0, t.shape[axis]).copy_(t)
    return room.narrow(axis, 0, t.shape[axis]) if narrow else room


def _rows(method: str, lengths, dtype=torch.float32, kv_heads: int = 2, dim: int = 64,
          step: bool = True, seed: int = 0):
    """Per row: its segments ([its block in a room, its step token] or, step False, [its raw
    tokens]) and its decoded keys and values, each row drawn apart."""
    codec, fmt, reference = _codecs(method) if step else (None, None, None)
    rows, decoded = [], []
    for i, n in enumerate(lengths):
        keys, values = (randn(1, kv_heads, n, dim, seed=seed + 10 * i + j, dtype=dtype).to(DEVICE)
                        for j in (1, 2))
        at = dict(batch=i % 2, narrow=i % 3 == 0)  # rows 1, 2: KVSegment.head of a room
        if codec is None:
            segment = KVSegment(_in_room(keys, -2, **at), _in_room(values, -2, **at)) \
                if step else KVSegment(keys, values)
            decoded.append((keys, values))
        else:
            pk, pv = codec.encode(keys), codec.encode(values)
            rooms = [{name: _in_room(t, token_axis(fmt, name), **at)
                      for name, t in p.tensors.items()} for p in (pk, pv)]
            segment = KVSegment(*rooms, fmt, fmt)
            decoded.append((reference.decode(pk), reference.decode(pv)))
        if step and not at["narrow"]:
            segment = segment.head(n)
        segments = [segment]
        if step:
            token = [randn(1, kv_heads, 1, dim, seed=seed + 10 * i + j, dtype=dtype).to(DEVICE)
                     for j in (3, 4)]
            segments.append(KVSegment(*token))
            decoded[-1] = tuple(torch.cat([d, t], 2) for d, t in zip(decoded[-1], token))
        rows.append(segments)
    return rows, decoded


def _check(query, rows, decoded, dtype, **features):
    """decode_attention_rows against decode_attention row by row (bit for bit) and against
    float64 attention over each row's decoded cache."""
    out = decode_attention_rows(query, rows, **features)
    assert out.shape == query.shape and out.dtype == query.dtype
    scaling = features.get("scaling") or query.shape[-1] ** -0.5
    for i, (segments, (keys, values)) in enumerate(zip(rows, decoded)):
        alone = decode_attention(query[i : i + 1], segments, **features)
        assert torch.equal(out[i : i + 1], alone), (i, (out[i : i + 1] - alone).abs().max())
        exact = exact_attention(query[i : i + 1].reshape(1, query.shape[1], -1), keys, values,
                                None, scaling, features.get("softcap"), features.get("sinks"))
        error = float((alone.double().reshape(exact.shape) - exact).norm() / exact.norm())
        assert error < ATTENTION_TOLERANCE[dtype], (i, error)


@pytest.mark.parametrize("method", METHODS)
def test_rows_read_as_each_row_alone(method):
    """Rows of 2, 34, 71 and 301 tokens (a block in a room, the step's token), GQA 3: one call,
    each row's output decode_attention's over it alone, and exact attention's within float32."""
    rows, decoded = _rows(method, LENGTHS)
    query = randn(len(rows), 6, 1, 64, seed=99).to(DEVICE)
    _check(query, rows, decoded, torch.float32, scaling=0.7 * 64 ** -0.5)


@pytest.mark.parametrize("method", ["raw", "intq4", "turbo3"])
def test_rows_with_softcap_and_sinks_in_bfloat16(method):
    rows, decoded = _rows(method, (1, 70), torch.bfloat16, seed=5)
    query = randn(2, 4, 1, 64, seed=98, dtype=torch.bfloat16).to(DEVICE)
    sinks = (2 * randn(4, seed=97) + 1).to(torch.bfloat16).to(DEVICE)
    _check(query, rows, decoded, torch.bfloat16, softcap=1.5, sinks=sinks)


@pytest.mark.parametrize("splits", [None, 2, 5])
def test_rows_of_raw_tokens_in_any_splits(splits):
    """Rows that hold raw tokens only (no block yet), MQA; splits forced as decode_attention's."""
    rows, decoded = _rows("raw", LENGTHS, kv_heads=1, step=False, seed=7)
    query = randn(len(rows), 4, 64, seed=96).to(DEVICE)
    _check(query, rows, decoded, torch.float32, splits=splits)


def test_a_row_with_more_splits_than_the_merge_takes_at_once():
    """One row of 17 splits (more than attention.COMBINE_CHUNK merges at once), one of 1: the
    short row's 16 empty partials fill the rest of its first chunk and all its second."""
    splits = attention.COMBINE_CHUNK + 1
    rows, decoded = _rows("raw", (5, 64 * splits), kv_heads=1, dim=32, step=False, seed=8)
    query = randn(2, 2, 32, seed=95).to(DEVICE)
    _check(query, rows, decoded, torch.float32, splits=splits)


class _Launches:
    """Stands in for a jitted kernel: counts its launches and keeps their tensors."""

    def __init__(self, kernel):
        self.kernel, self.count, self.tensors = kernel, 0, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.count += 1
            self.tensors += [a for a in args if isinstance(a, torch.Tensor)]
            return self.kernel[grid](*args, **kwargs)
        return launch


def test_the_launches_do_not_grow_with_the_rows():
    """2 rows or 5: one _split per slot (the block, the step's token) and one _combine; the
    tables hold the rooms' own addresses (read in place, not copied)."""
    counts = {}
    for count in (2, 5):
        split, combine = _Launches(attention._SPLIT), _Launches(attention._combine)
        rows, _ = _rows("intq4", (3, 40, 9, 1, 20)[:count], seed=count)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(attention, "_SPLIT", split)
            patch.setattr(attention, "_combine", combine)
            decode_attention_rows(randn(count, 4, 64, seed=count).to(DEVICE), rows)
        counts[count] = (split.count, combine.count)
        addresses = {int(a) for t in split.tensors if t.dtype == torch.int64 for a in t.flatten()}
        for segments in rows:
            for side in (segments[0].keys, segments[0].values):
                assert all(t.data_ptr() in addresses for t in side.values())
    assert counts == {2: (2, 1), 5: (2, 1)}
    assert LINE == attention._LINE.value  # the kernel's line, as rows.py writes it


def test_rows_of_other_structures_go_apart_and_are_refused_together():
    """row_formats: one key per structure (formats segment by segment), None for rows it cannot
    read; decode_attention_rows refuses rows of two structures."""
    packed, _ = _rows("intq4", (4, 9), seed=1)
    turbo, _ = _rows("turbo3", (6,), seed=2)
    raw, _ = _rows("raw", (5, 3), step=False, seed=3)
    channel = IntQFormat(2, 32, "channel")  # kivi's keys: no fused attention
    codes = torch.zeros(1, 2, 64, 8, dtype=torch.uint8)
    kivi = [KVSegment({"codes": codes}, raw[0][0].values, channel, None)]
    batch2 = [KVSegment(torch.zeros(2, 2, 3, 64), torch.zeros(2, 2, 3, 64))]
    rows = [packed[0], raw[0], turbo[0], kivi, packed[1], batch2, raw[1], []]
    assert row_formats(packed[0]) == row_formats(packed[1]) != row_formats(turbo[0])
    keys = [row_formats(row) for row in rows]
    assert keys[0] == keys[4] and keys[1] == keys[6] and len({keys[0], keys[1], keys[2]}) == 3
    assert [i for i, key in enumerate(keys) if key is None] == [3, 5, 7]
    query = randn(2, 4, 64, seed=1).to(DEVICE)
    with pytest.raises(ValueError, match="rows of one structure.*row_formats"):
        decode_attention_rows(query, [packed[0], raw[0]])
    with pytest.raises(ValueError, match="2 queries for 3 rows"):
        decode_attention_rows(query, packed + turbo)
    # one structure, but not alike: other KV heads, another head_dim
    mqa, _ = _rows("raw", (5,), kv_heads=1, step=False)
    with pytest.raises(ValueError, match=r"rows of different KV heads: \[1, 2\]"):
        decode_attention_rows(query, [raw[0], mqa[0]])
    narrow, _ = _rows("raw", (5,), dim=32, step=False)
    with pytest.raises(ValueError, match="tensor is not like the first's"):
        decode_attention_rows(query, [raw[0], narrow[0]])
