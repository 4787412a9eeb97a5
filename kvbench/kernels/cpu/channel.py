"""Keys or values quantized per channel over tokens (intq axis "channel": KIVI's keys) read by
the CPU fused decode attention where they lie, never decoded into memory.

A channel's codes over one group of G tokens share a scale s and a min m, so a key's score is
sum_d q_d (s_d c_dt + m_d) = sum_d (q_d s_d) c_dt + sum_d q_d m_d: per group, the query is scaled
once per channel and the group's D x G block of codes unpacked once (8 codes from each `bits`
bytes), then each query head of the KV head (GQA) sums the block along the channels with G
tokens side by side in SIMD lanes. Values alike: per group and channel, s_d sum_t w_t c_dt +
m_d sum_t w_t. Sums are reassociated: the results match attention over the decoded K/V within
float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit, prange, types

from kvbench.kernels.cpu.stored import (
    FAST, HALF_TO_FLOAT, MIN_CHUNK, array, as_float, flat, job_split, on_pool,
)
from kvbench.kernels.formats import IntQFormat


@functools.cache
def kernels(bits: int, group_size: int, scale_dtype: type):
    """{parallel: (scores, values)} for channel rows of `bits`-bit codes in groups of
    `group_size` tokens, scales and mins stored as `scale_dtype` (float16 as its uint16 bits).
    Compiled here, all four, on first use."""
    mask, slots = (1 << bits) - 1, group_size // 8

    @njit(inline="always")
    def unpack(codes, bh, g, block):
        """The codes of group g, every channel, into block (channels, group_size)."""
        first = g * group_size * bits // 8
        for d in range(block.shape[0]):
            for s in range(slots):
                at, word = first + s * bits, np.uint64(0)
                for b in range(bits):
                    word |= np.uint64(codes[bh, d, at + b]) << np.uint64(8 * b)
                for k in range(8):
                    block[d, s * 8 + k] = np.float32((word >> np.uint64(k * bits))
                                                     & np.uint64(mask))

    def scores(q, codes, scale, zmin, half, out, offset, tokens, chunks, per):
        dim, groups = q.shape[2], -(-tokens // group_size)
        for job in prange(q.shape[0] * chunks):
            bh, first = job // chunks, job % chunks * per
            block = np.empty((dim, group_size), np.float32)
            acc = np.empty(group_size, np.float32)
            for g in range(first, min(groups, first + per)):
                unpack(codes, bh, g, block)
                start = offset + g * group_size
                for h in range(q.shape[1]):
                    acc[:] = 0.0
                    base = np.float32(0.0)
                    for d in range(dim):
                        qd = q[bh, h, d]
                        base += qd * as_float(zmin[bh, d, g], half)
                        qs = qd * as_float(scale[bh, d, g], half)
                        for t in range(group_size):
                            acc[t] += qs * block[d, t]
                    for t in range(min(group_size, tokens - g * group_size)):
                        out[bh, h, start + t] = acc[t] + base

    def values(w, codes, scale, zmin, half, partial, offset, tokens, chunks, per):
        dim, groups = partial.shape[3], -(-tokens // group_size)
        for job in prange(w.shape[0] * chunks):
            bh, first = job // chunks, job % chunks * per
            acc = partial[bh, job % chunks]
            block = np.empty((dim, group_size), np.float32)
            for g in range(first, min(groups, first + per)):
                unpack(codes, bh, g, block)
                start, n = offset + g * group_size, min(group_size, tokens - g * group_size)
                for h in range(w.shape[1]):
                    total = np.float32(0.0)
                    for t in range(n):
                        total += w[bh, h, start + t]
                    for d in range(dim):
                        s = np.float32(0.0)
                        for t in range(n):
                            s += w[bh, h, start + t] * block[d, t]
                        acc[h, d] += as_float(scale[bh, d, g], half) * s \
                            + as_float(zmin[bh, d, g], half) * total

    f32, stored = np.float32, array(scale_dtype, 3, "A")
    place = (types.int64,) * 4  # offset, tokens, chunks, per
    signatures = (
        types.void(array(f32, 3), array(np.uint8, 3, "A"), stored, stored, array(f32, 1),
                   array(f32, 3), *place),
        types.void(array(f32, 3), array(np.uint8, 3, "A"), stored, stored, array(f32, 1),
                   array(f32, 4), *place),
    )
    return {parallel: tuple(njit(signature, parallel=parallel, fastmath=FAST)(kernel)
                            for signature, kernel in zip(signatures, (scores, values)))
            for parallel in (False, True)}


class ChannelSide:
    """The keys or the values of one segment stored per channel, as the kernels read them (the
    interface of kvbench.kernels.cpu.attention's raw and per-token sides): its first `tokens`
    tokens, which must lie in whole groups of the stored tensors."""

    def __init__(self, side: dict[str, torch.Tensor], fmt: IntQFormat, tokens: int):
        codes, scale, zmin = (flat(side[name]) for name in ("codes", "scale", "min"))
        self.groups = -(-tokens // fmt.group_size)
        if codes.shape[2] * 8 < self.groups * fmt.group_size * fmt.bits \
                or scale.shape[2] < self.groups:
            raise ValueError(f"{tokens} tokens per channel in groups of {fmt.group_size} need"
                             f" {self.groups} whole groups; the stored tensors hold"
                             f" {scale.shape[2]}")
        self.args = (codes, scale, zmin, HALF_TO_FLOAT)
        self.kernels = kernels(fmt.bits, fmt.group_size, scale.dtype.type)
        self.tokens, self.group_size = tokens, fmt.group_size

    def jobs(self, heads: int) -> tuple[int, int]:
        """(chunks per sequence-head, groups per chunk)."""
        return job_split(self.groups, heads, max(1, MIN_CHUNK // self.group_size))

    def kernel(self, which: int, heads: int):
        """The scores (0) or values (1) kernel, on numba's threads for big reads."""
        return self.kernels[on_pool(heads * self.tokens)][which]

    def scores(self, q: torch.Tensor, out: torch.Tensor, offset: int) -> None:
        """Writes q's scores against these keys into out[..., offset:offset + tokens]."""
        heads = q.shape[0]
        self.kernel(0, heads)(q.contiguous().numpy(), *self.args, out.numpy(), offset,
                              self.tokens, *self.jobs(heads))

    def values(self, weights: torch.Tensor, offset: int) -> torch.Tensor:
        """These values summed by weights[..., offset:offset + tokens]."""
        heads, group = weights.shape[:2]
        chunks, per = self.jobs(heads)
        partial = np.zeros((heads, chunks, group, self.args[0].shape[1]), np.float32)
        self.kernel(1, heads)(weights.numpy(), *self.args, partial, offset, self.tokens, chunks,
                              per)
        return torch.from_numpy(partial.sum(1))
