"""The CPU fused decode attention of a batched step (kvbench.models.batch_step): every row's one
query over its own cache in one kernel call per layer, instead of one call (and its Python and
setup) per row.

A row's cache is one packed segment then one raw float32 segment (either may be empty), each
read where it lies: rows of any lengths, nothing padded or copied. The kernel gets a table of
addresses and strides, one line per row, and runs one job per (row, KV head) on numba's threads,
each whole: scores over the packed tokens (decoded row by row as kvbench.kernels.cpu.attention
decodes them, turbo in its rotated domain) and the raw ones, softmax, then the weighted values.
A row's result depends on its own cache alone: the same bits whatever rows share the step.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
import torch
from numba import carray, njit, prange, types

from kvbench.kernels.cpu.attention import POOL, read_layout, rotate, stored_names
from kvbench.kernels.cpu.stored import FAST, HALF_TO_FLOAT, array, as_float, slot_order
from kvbench.kernels.cpu.row_decode import as_pointer, row_decoder
from kvbench.kernels.formats import (
    KernelFormat, KVSegment, is_channel, is_turbo, token_axis,
)

# A row's line in the address table: (address, head stride, token stride) in bytes for the key
# codes, scales and mins, the same for the values, for the raw keys and the raw values; then the
# packed and the raw token counts.
K_PACKED, V_PACKED, K_RAW, V_RAW, PACKED, RAW = 0, 9, 18, 21, 24, 25
# Rows (KV heads x tokens, over all sequences) read at least for the kernel to go parallel. A
# 25-row model step over ~200-token caches (15k rows) took 0.80x identity's step time with the
# kernel on the caller's thread against 0.74x on numba's for turbo3 (intq4 alike either way; 2
# cores, steps interleaved): waking the pool costs more than it saves there.
PARALLEL_ROWS = 1 << 16


def batch_formats(segments: list[KVSegment]) -> tuple[KernelFormat, KernelFormat] | None:
    """The (key, value) formats of a row whose segments the batched kernel reads: one packed
    segment of per-token layouts, then at most one raw float32 one (each token's values
    contiguous, as the codecs and the model make them); None for any other row."""
    packed, *raw = segments
    formats = packed.key_format, packed.value_format
    if None in formats or any(map(is_channel, formats)) or len(raw) > 1 \
            or (raw and (raw[0].key_format is not None or raw[0].keys.dtype != torch.float32)):
        return None
    return formats


def decode_attention_rows(query: torch.Tensor, rows: list[list[KVSegment]],
                          scaling: float | None = None) -> torch.Tensor:
    """Row i of query (rows, q_heads, [1,] head_dim) attended over rows[i]'s segments, every
    row one batch_formats accepted with the same formats; query's shape and dtype."""
    first = rows[0][0]
    key_fmt, value_fmt = first.key_format, first.value_format
    lines = [_line(segments, key_fmt, value_fmt) for segments in rows]
    formats = RowFormats(key_fmt, value_fmt, scale_dtype(first.keys, key_fmt),
                         scale_dtype(first.values, value_fmt))
    return attend_lines(query, lines, formats, first.keys["codes"].shape[1], scaling)


@dataclass(frozen=True)
class RowFormats:
    """The layouts of the rows' packed keys and values, and the dtypes their scales are stored
    in (numpy's: float16 as its uint16 bits)."""

    key: KernelFormat
    value: KernelFormat
    key_scale: type
    value_scale: type


def attend_lines(query: torch.Tensor, lines: list[list[int]], formats: RowFormats,
                 kv_heads: int, scaling: float | None = None) -> torch.Tensor:
    """Row i of query (rows, q_heads, [1,] head_dim) attended over the cache of `kv_heads` heads
    whose places lines[i] gives (finished_line's); query's shape and dtype."""
    shape = query.shape
    count, q_heads, dim = shape[0], shape[1], shape[-1]
    key_fmt, value_fmt = formats.key, formats.value
    table = np.array(lines, np.int64)
    group = q_heads // kv_heads
    q = query.detach().reshape(count, kv_heads, group, dim).float()
    q_packed = rotate(q, key_fmt, inverse=False) if is_turbo(key_fmt) else q
    q_packed = q_packed[..., slot_order(dim)].contiguous()
    key_layout, key_table, key_scale = read_layout(key_fmt, dim, formats.key_scale)
    value_layout, value_table, value_scale = read_layout(value_fmt, dim, formats.value_scale)
    out_packed = torch.zeros(count, kv_heads, group, dim)
    out_raw = torch.zeros(count, kv_heads, group, dim)
    scaling = dim ** -0.5 if scaling is None else scaling
    with POOL, torch.no_grad():
        numba.set_num_threads(min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
        parallel = int(table[:, PACKED:].sum()) * kv_heads >= PARALLEL_ROWS \
            and numba.get_num_threads() > 1
        kernel(key_layout, value_layout, group, parallel)(
            q_packed.numpy(), q.contiguous().numpy(), table, key_table, key_scale, value_table,
            value_scale, HALF_TO_FLOAT, np.float32(scaling), out_packed.numpy(), out_raw.numpy())
    natural = torch.empty_like(out_packed)
    natural[..., slot_order(dim)] = out_packed
    if is_turbo(value_fmt):
        natural = rotate(natural, value_fmt, inverse=True)
    return (natural + out_raw).to(query.dtype).reshape(shape)


def scale_dtype(side: dict, fmt: KernelFormat) -> type:
    """The dtype `side`'s scales are stored in, as the kernel reads them."""
    dtype = side[stored_names(fmt)[0]].dtype
    return np.uint16 if dtype == torch.float16 else np.float32


def _line(segments: list[KVSegment], key_fmt: KernelFormat, value_fmt: KernelFormat) -> list[int]:
    """A row's line of the address table."""
    packed, *raw = segments
    line = [*packed_places(packed.keys, key_fmt), *packed_places(packed.values, value_fmt)]
    if raw:
        line += [*raw_places(raw[0].keys), *raw_places(raw[0].values)]
    return finished_line(line, packed.tokens, raw[0].tokens if raw else 0)


def finished_line(places: list[int], packed: int, raw: int) -> list[int]:
    """The table's line of a row whose places (packed_places of the keys and the values, then
    raw_places of the raw keys and values where it has raw tokens) are `places`."""
    return [*places, *[0] * (PACKED - len(places)), packed, raw]


def raw_places(side: torch.Tensor, row: int = 0) -> list[int]:
    """(address, head stride, token stride) in bytes of row `row`'s raw float32 tokens."""
    size, strides = side.element_size(), side.stride()
    if strides[-1] != 1:
        raise ValueError(f"a raw token's values are not contiguous: strides {strides}")
    return [side.data_ptr() + row * strides[0] * size, strides[1] * size, strides[2] * size]


def packed_places(side: dict, fmt: KernelFormat) -> list[int]:
    """(address, head stride, token stride) in bytes of the codes, scales and mins."""
    places = []
    for name in ("codes", *stored_names(fmt)):
        tensor = side[name]
        size, strides = tensor.element_size(), tensor.stride()
        # the row decoder reads a token's values as one run of bytes
        if strides[-1] != 1 or (len(strides) > 4 and strides[-2] != tensor.shape[-1]):
            raise ValueError(f"a token's {name} are not contiguous: strides {strides}")
        places += [tensor.data_ptr(), strides[1] * size,
                   strides[len(strides) + token_axis(fmt, name)] * size]
    return places


@functools.cache
def _row_reader(bits: int, dim: int, unit: int, has_min: bool, lookup: bool, scale_dtype: type):
    """read(line, first, head, token, table, row_scale, half, factors, row): the packed row of
    (head, token) whose places start at line[first], decoded into `row` (slot-major)."""
    per_unit = unit // 8
    groups = -(-dim // 8 // per_unit)
    decode_vector = row_decoder(bits, dim, per_unit, has_min, lookup)

    @njit(inline="always")
    def read(line, first, head, token, table, row_scale, half, factors, row):
        codes = line[first] + head * line[first + 1] + token * line[first + 2]
        scales = carray(as_pointer(line[first + 3] + head * line[first + 4]
                                   + token * line[first + 5]), (groups,), scale_dtype)
        mins = carray(as_pointer(line[first + 6] + head * line[first + 7]
                                 + token * line[first + 8]), (groups,), scale_dtype)
        for g in range(groups):
            factors[0, g] = as_float(scales[g], half) * row_scale
            if has_min:
                factors[1, g] = as_float(mins[g], half)
        decode_vector(row.ctypes.data, np.uint64(codes), factors[0].ctypes.data,
                      factors[1].ctypes.data, table.ctypes.data)

    return read, groups


@functools.cache
def kernel(key_layout: tuple, value_layout: tuple, group: int, parallel: bool):
    """The batched attention for keys and values of these layouts (read_layout's) and `group`
    query heads per KV head, on numba's threads (parallel) or the caller's, compiled on first
    use (~4 s). Both give the same bits (tested): a job's loops are the same code either way."""
    read_key, key_groups = _row_reader(*key_layout)
    read_value, value_groups = _row_reader(*value_layout)
    dim, width = key_layout[1], max(key_groups, value_groups)

    def attend(q_packed, q_raw, table, key_table, key_scale, value_table, value_scale, half,
               scaling, out_packed, out_raw):
        heads = q_packed.shape[1]
        for job in prange(table.shape[0] * heads):
            r, h = job // heads, job % heads
            line = table[r]
            packed, raw = line[PACKED], line[RAW]
            weights = np.empty((group, packed + raw), np.float32)
            row, factors = np.empty(dim, np.float32), np.empty((2, width), np.float32)
            for t in range(packed):
                read_key(line, K_PACKED, h, t, key_table, key_scale, half, factors, row)
                for g in range(group):
                    acc = np.float32(0.0)
                    for i in range(dim):
                        acc += q_packed[r, h, g, i] * row[i]
                    weights[g, t] = acc * scaling
            for t in range(raw):
                keys = carray(as_pointer(line[K_RAW] + h * line[K_RAW + 1]
                                         + t * line[K_RAW + 2]), (dim,), np.float32)
                for g in range(group):
                    acc = np.float32(0.0)
                    for i in range(dim):
                        acc += q_raw[r, h, g, i] * keys[i]
                    weights[g, packed + t] = acc * scaling
            for g in range(group):
                top = weights[g].max()
                total = np.float32(0.0)
                for t in range(packed + raw):
                    weights[g, t] = np.exp(weights[g, t] - top)
                    total += weights[g, t]
                weights[g] /= total
            for t in range(packed):
                read_value(line, V_PACKED, h, t, value_table, value_scale, half, factors, row)
                for g in range(group):
                    p = weights[g, t]
                    for i in range(dim):
                        out_packed[r, h, g, i] += p * row[i]
            for t in range(raw):
                values = carray(as_pointer(line[V_RAW] + h * line[V_RAW + 1]
                                           + t * line[V_RAW + 2]), (dim,), np.float32)
                for g in range(group):
                    p = weights[g, packed + t]
                    for i in range(dim):
                        out_raw[r, h, g, i] += p * values[i]

    f32 = types.float32
    signature = types.void(array(np.float32, 4), array(np.float32, 4), array(np.int64, 2),
                           array(np.float32, 1), f32, array(np.float32, 1), f32,
                           array(np.float32, 1), f32, array(np.float32, 4), array(np.float32, 4))
    return njit(signature, parallel=parallel, fastmath=FAST)(attend)
