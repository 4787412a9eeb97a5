"""Fused decode attention over packed K/V on the CPU (numba): one query token per sequence reads
a layer's cache as it is stored (segments of packed or raw tokens), decoding one token's row at
a time into a D-float buffer while it is used, never the cache into memory.

Two passes, each parallel over (sequence, KV head, token chunk): every key's score, a softmax
over all of them (torch), then the weighted sum of the values. Rows decode as their codecs
decode them (intq: code * scale + min; lloydmax: centroid * norm / scale); turbo stays in the
rotated domain, as in the Triton kernel: the query is rotated once (R q) and the summed values
turned back once (R^T). The query heads that share a KV head (GQA) reuse each decoded row. Raw
segments (the full-precision tail) go through torch's matrix products; rows of channels over
tokens (kivi's keys) through kvbench.kernels.cpu.channel.

A row is decoded in slot-major order: position j * M + m holds dim 8 m + j (M = D / 8), so the 8
codes in each `bits` bytes unpack from one word with constant shifts, all M words of a row at
once as one SIMD vector (kvbench.kernels.cpu.row_decode); the query and the summed values are
permuted to match. Each layout's kernels are compiled on first use with its bit width, head size
and group as constants, and sums are reassociated: results match softmax(q K^T * scaling + bias)
V over the decoded K/V within float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools
import math
import threading
import weakref

import numba
import numpy as np
import torch
from numba import njit, prange, types

from kvbench.kernels.cpu.channel import ChannelSide
from kvbench.kernels.cpu.row_decode import row_decoder
from kvbench.kernels.cpu.stored import (
    FAST, HALF_TO_FLOAT, MIN_CHUNK, NO_TABLE, array, as_float, flat, job_split, on_pool,
    slot_order,
)
from kvbench.kernels.formats import (
    CodebookFormat, IntQFormat, KernelFormat, KVSegment, check_decode_shapes, is_channel,
    is_turbo,
)

# numba's workqueue pool takes one caller at a time (the server's engine thread is the only one
# there; this keeps any other from aborting the process)
POOL = threading.Lock()


def _signatures(scale_dtype: type) -> tuple:
    """The scores and values kernels' signatures: the arrays made here C-contiguous (so the
    dot products vectorise), the cache's views of any layout, scales stored as `scale_dtype`."""
    f32 = np.float32
    stored = (array(np.uint8, 3, "A"), array(scale_dtype, 3, "A"), array(scale_dtype, 3, "A"),
              array(f32, 1), types.float32, array(f32, 1))
    place = (types.int64,) * 3  # offset, chunks, per
    return (types.void(array(f32, 3), *stored, array(f32, 3), *place),
            types.void(array(f32, 3), *stored, array(f32, 4), *place))


@functools.cache
def kernels(bits: int, dim: int, unit: int, has_min: bool, lookup: bool, scale_dtype: type):
    """{parallel: (scores, values)}: the kernels for rows of `dim` codes of `bits` bits, one
    scale (and min, has_min) per `unit` values stored as `scale_dtype` (float16 as its uint16
    bits), on numba's threads (parallel) or the caller's; a code is its value (intq) or indexes
    a table (lookup). Compiled here, all four (~4 s), so the first call of a layout pays it
    whatever its size: a benchmark's warm-up step covers it."""
    per_unit = unit // 8
    groups = -(-dim // 8 // per_unit)
    decode_vector = row_decoder(bits, dim, per_unit, has_min, lookup)

    @njit(inline="always")
    def decode_row(codes, scale, zmin, bh, t, table, row_scale, half, factors, row):
        for g in range(groups):
            factors[0, g] = as_float(scale[bh, t, g], half) * row_scale
            if has_min:
                factors[1, g] = as_float(zmin[bh, t, g], half)
        decode_vector(row.ctypes.data, codes[bh, t].ctypes.data, factors[0].ctypes.data,
                      factors[1].ctypes.data, table.ctypes.data)

    def scores(q, codes, scale, zmin, table, row_scale, half, out, offset, chunks, per):
        tokens = codes.shape[1]
        for job in prange(q.shape[0] * chunks):
            bh, first = job // chunks, job % chunks * per
            row, factors = np.empty(dim, np.float32), np.empty((2, groups), np.float32)
            for t in range(first, min(tokens, first + per)):
                decode_row(codes, scale, zmin, bh, t, table, row_scale, half, factors, row)
                for h in range(q.shape[1]):
                    acc = np.float32(0.0)
                    for i in range(dim):
                        acc += q[bh, h, i] * row[i]
                    out[bh, h, offset + t] = acc

    def values(w, codes, scale, zmin, table, row_scale, half, partial, offset, chunks, per):
        tokens = codes.shape[1]
        for job in prange(w.shape[0] * chunks):
            bh, first = job // chunks, job % chunks * per
            acc = partial[bh, job % chunks]
            row, factors = np.empty(dim, np.float32), np.empty((2, groups), np.float32)
            for t in range(first, min(tokens, first + per)):
                decode_row(codes, scale, zmin, bh, t, table, row_scale, half, factors, row)
                for h in range(w.shape[1]):
                    p = w[bh, h, offset + t]
                    for i in range(dim):
                        acc[h, i] += p * row[i]

    signatures = _signatures(scale_dtype)
    return {parallel: tuple(njit(signature, parallel=parallel, fastmath=FAST)(kernel)
                            for signature, kernel in zip(signatures, (scores, values)))
            for parallel in (False, True)}


def _per_format(make):
    """make(fmt, *args), computed once per format object and kept while the format lives (a
    codec's format lives as long as the codec: every layer and side has its own, more than any
    fixed-size cache holds)."""
    made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @functools.wraps(make)
    def once(fmt, *args):
        per_args = made.setdefault(fmt, {})
        if args not in per_args:
            per_args[args] = make(fmt, *args)
        return per_args[args]

    return once


@_per_format
def _codebook(fmt: CodebookFormat) -> np.ndarray:
    """fmt's centroids padded to a multiple of 8 entries (the row decoder reads eight at a
    time)."""
    table = fmt.tables(torch.device("cpu"))[0].numpy()
    return np.pad(table, (0, -len(table) % 8))


def stored_names(fmt: KernelFormat) -> tuple[str, str]:
    """The stored tensors a row's scale and min come from (a codebook's norm stands in for
    both; its kernels never read the min)."""
    if isinstance(fmt, IntQFormat):
        return "scale", "min"
    return fmt.norm_name, fmt.norm_name


def read_layout(fmt: KernelFormat, dim: int, scale_dtype: type) -> tuple[tuple, np.ndarray,
                                                                         np.float32]:
    """How the kernels read fmt's rows of `dim` values whose scales are stored as
    `scale_dtype`: (the layout, as kernels() takes it; the code table; the row scale)."""
    if isinstance(fmt, IntQFormat):
        return (fmt.bits, dim, fmt.group_size, True, False, scale_dtype), NO_TABLE, \
            np.float32(1.0)
    row_scale = 1.0 if fmt.kind == "turbo" else 1.0 / fmt.scale32
    return (fmt.bits, dim, fmt.block, False, True, scale_dtype), _codebook(fmt), \
        np.float32(row_scale)


def _fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard butterflies over the last dim, in kvbench's order."""
    n, h = x.shape[-1], 1
    while h < n:
        pairs = x.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        x = torch.stack((pairs[..., 0, :] + pairs[..., 1, :],
                         pairs[..., 0, :] - pairs[..., 1, :]), dim=-2).reshape(x.shape)
        h *= 2
    return x


@_per_format
def _rotation(fmt: CodebookFormat, inverse: bool) -> torch.Tensor:
    """The (block, block) matrix M with x @ M = R x for a row x (R^T x when inverse): the
    butterflies applied to the identity, signs and scale folded in. One matrix product per call
    costs a few microseconds, the butterflies' small operations ~0.4 ms."""
    _, _, d1, d2 = fmt.tables(torch.device("cpu"))
    first, then = (d2, d1) if inverse else (d1, d2)
    hadamard = _fwht(torch.eye(fmt.block, dtype=torch.float64))
    return (first.double()[:, None] * hadamard * then.double()[None, :]
            / math.sqrt(fmt.block)).float()


def rotate(x: torch.Tensor, fmt: CodebookFormat, inverse: bool) -> torch.Tensor:
    """Each block of x's rows: R x (the turbo query) or R^T x (the summed values)."""
    blocks = x.reshape(*x.shape[:-1], -1, fmt.block)
    return (blocks @ _rotation(fmt, inverse)).reshape(x.shape)


class _Side:
    """The keys or the values of one segment, as the kernels read them."""

    def __init__(self, side, fmt: KernelFormat | None, dim: int):
        self.fmt, self.dim = fmt, dim
        self.turbo = is_turbo(fmt)
        if fmt is None:
            self.raw = side.detach().float().reshape(-1, *side.shape[2:])
            self.tokens = self.raw.shape[1]
            return
        codes = flat(side["codes"])
        scale_name, min_name = stored_names(fmt)
        scale = flat(side[scale_name])
        layout, table, row_scale = read_layout(fmt, dim, scale.dtype.type)
        self.args = (codes, scale, flat(side[min_name]), table, row_scale, HALF_TO_FLOAT)
        self.kernels = kernels(*layout)
        self.tokens = codes.shape[1]

    def jobs(self, bh: int) -> tuple[int, int]:
        """(chunks per sequence-head, tokens per chunk)."""
        return job_split(self.tokens, bh, MIN_CHUNK)

    def kernel(self, which: int, bh: int):
        """The scores (0) or values (1) kernel, on numba's threads for big reads."""
        return self.kernels[on_pool(bh * self.tokens)][which]

    def scores(self, q: torch.Tensor, out: torch.Tensor, offset: int) -> None:
        """Writes q's scores against these keys into out[..., offset:offset + tokens]."""
        if self.fmt is None:
            torch.matmul(q, self.raw.transpose(1, 2), out=out[..., offset:offset + self.tokens])
            return
        if self.turbo:
            q = rotate(q, self.fmt, inverse=False)
        q = q[..., slot_order(self.dim)].contiguous().numpy()
        self.kernel(0, q.shape[0])(q, *self.args, out.numpy(), offset, *self.jobs(q.shape[0]))

    def values(self, weights: torch.Tensor, offset: int) -> torch.Tensor:
        """These values summed by weights[..., offset:offset + tokens]."""
        if self.fmt is None:
            return torch.matmul(weights[..., offset:offset + self.tokens], self.raw)
        chunks, per = self.jobs(weights.shape[0])
        partial = np.zeros((weights.shape[0], chunks, weights.shape[1], self.dim), np.float32)
        self.kernel(1, weights.shape[0])(weights.numpy(), *self.args, partial, offset, chunks,
                                         per)
        out = torch.empty(*weights.shape[:2], self.dim)
        out[..., slot_order(self.dim)] = torch.from_numpy(partial.sum(1))
        return rotate(out, self.fmt, inverse=True) if self.turbo else out


def _side(side, fmt: KernelFormat | None, dim: int, tokens: int) -> _Side | ChannelSide:
    """The reader of one side of a segment of `tokens` tokens; ValueError for a packed layout
    the CPU kernels cannot read."""
    reason = None if fmt is None else fmt.cpu_attention_unsupported(dim)
    if reason:
        raise ValueError(f"the CPU fused attention cannot read {fmt}: {reason}")
    return ChannelSide(side, fmt, tokens) if is_channel(fmt) else _Side(side, fmt, dim)


def decode_attention(query: torch.Tensor, segments: list[KVSegment],
                     bias: torch.Tensor | None = None, scaling: float | None = None,
                     softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(query K^T * scaling + bias) V over the segments' tokens, in order, for one query
    token per sequence, on CPU tensors: kvbench.kernels.triton.segments.decode_attention's
    contract (query (batch, q_heads, [1,] head_dim); segments of (batch, kv_heads, tokens,
    head_dim); bias None or (batch, kv_heads, all tokens)). softcap: the logits become
    softcap * tanh(logits / softcap) first (Gemma 2); sinks (q_heads,): one more logit per query
    head that takes its share of the softmax and adds no value (gpt-oss). Returns query's shape
    and dtype.
    """
    shape = query.shape
    batch, q_heads, dim = shape[0], shape[1], shape[-1]
    kv_heads, total = check_decode_shapes(segments, batch, q_heads, bias)
    group = q_heads // kv_heads
    # no gradient flows through the kernels: the arrays they read are detached
    with POOL, torch.no_grad():
        numba.set_num_threads(min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
        if sinks is not None:  # per (sequence-head, query head of its group)
            sinks = sinks.detach().float().reshape(1, kv_heads, group, 1).expand(
                batch, -1, -1, -1).reshape(batch * kv_heads, group, 1)
        out = _attend(query.detach().reshape(batch * kv_heads, group, dim).float(), segments, dim,
                      dim ** -0.5 if scaling is None else scaling,
                      None if bias is None else bias.float().reshape(batch * kv_heads, 1, total),
                      softcap, sinks)
    return out.to(query.dtype).reshape(shape)


def _attend(q: torch.Tensor, segments: list[KVSegment], dim: int, scaling: float,
            bias: torch.Tensor | None, softcap: float | None = None,
            sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The attention of q (sequence-heads, group, dim) float32 over the segments."""
    sides = [(_side(s.keys, s.key_format, dim, s.tokens),
              _side(s.values, s.value_format, dim, s.tokens))
             for s in map(KVSegment.trimmed, segments)]
    scores = torch.empty(*q.shape[:2], sum(keys.tokens for keys, _ in sides))
    offset = 0
    for keys, _ in sides:
        keys.scores(q, scores, offset)
        offset += keys.tokens
    scores.mul_(scaling)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores += bias
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1].contiguous()
    out, offset = torch.zeros_like(q), 0
    for _, values in sides:
        out += values.values(weights, offset)
        offset += values.tokens
    return out
