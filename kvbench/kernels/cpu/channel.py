"""Keys or values quantized per channel over tokens (intq axis "channel": KIVI's keys) read by
the CPU fused decode attention where they lie, never decoded into memory.

A channel's G codes of one group of tokens are `bits` x G / 8 consecutive bytes under one scale
and min: a row for kvbench.kernels.cpu.row_decode's SIMD decoder, which turns them into G
floats (code * scale + min, slot-major). Per group, the D x G block of every channel is decoded
once, then each query head of the KV head (GQA) sums it along the channels with the group's
tokens side by side in SIMD lanes (scores), or sums each channel's row against the tokens'
weights (values). Sums are reassociated: the results match attention over the decoded K/V
within float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit, prange, types

from kvbench.kernels.cpu.row_decode import row_decoder
from kvbench.kernels.cpu.stored import (
    FAST, HALF_TO_FLOAT, MIN_CHUNK, NO_TABLE, array, as_float, flat, job_split, on_pool,
    slot_order,
)
from kvbench.kernels.formats import IntQFormat


@functools.cache
def kernels(bits: int, group_size: int, scale_dtype: type):
    """{parallel: (scores, values)} for channel rows of `bits`-bit codes in groups of
    `group_size` tokens, scales and mins stored as `scale_dtype` (float16 as its uint16 bits).
    Compiled here, all four, on first use."""
    row_bytes = group_size * bits // 8
    decode_vector = row_decoder(bits, group_size, group_size // 8, True, False)
    # the token of the group at each position of a decoded row (the decoder's slot-major order)
    token_at = slot_order(group_size).numpy()

    @njit(inline="always")
    def decode_block(codes, scale, zmin, half, bh, g, factors, block):
        """Group g of every channel, decoded (code * scale + min) into block (channels,
        group_size), each row slot-major, by the SIMD row decoder."""
        for d in range(block.shape[0]):
            factors[0, 0] = as_float(scale[bh, d, g], half)
            factors[1, 0] = as_float(zmin[bh, d, g], half)
            decode_vector(block[d].ctypes.data, codes[bh, d].ctypes.data + g * row_bytes,
                          factors[0].ctypes.data, factors[1].ctypes.data, NO_TABLE.ctypes.data)

    @njit(inline="always")
    def score_head(q, out, bh, chunk, h, block, acc, start, n):
        """Query head h's scores against the group's tokens, into out from token start."""
        acc[:] = 0.0
        for d in range(block.shape[0]):
            qd = q[bh, h, d]
            for p in range(group_size):
                acc[p] += qd * block[d, p]
        for p in range(group_size):
            if token_at[p] < n:
                out[bh, h, start + token_at[p]] = acc[p]

    @njit(inline="always")
    def value_head(w, partial, bh, chunk, h, block, weights, start, n):
        """The group's values summed by query head h's weights, into its chunk's partial sum."""
        for p in range(group_size):
            weights[p] = w[bh, h, start + token_at[p]] if token_at[p] < n else 0.0
        for d in range(block.shape[0]):
            s = np.float32(0.0)
            for p in range(group_size):
                s += weights[p] * block[d, p]
            partial[bh, chunk, h, d] += s

    def over_groups(per_head):
        """A kernel that decodes each group of a job's chunk once, then hands it to per_head
        for every query head of the KV head (x: the queries or the weights, (BH, heads, ...))."""
        def kernel(x, codes, scale, zmin, half, into, offset, tokens, chunks, per):
            dim, groups = codes.shape[1], -(-tokens // group_size)
            for job in prange(x.shape[0] * chunks):
                bh, chunk = job // chunks, job % chunks
                block = np.empty((dim, group_size), np.float32)
                factors, lanes = np.empty((2, 1), np.float32), np.empty(group_size, np.float32)
                for g in range(chunk * per, min(groups, chunk * per + per)):
                    decode_block(codes, scale, zmin, half, bh, g, factors, block)
                    start, n = offset + g * group_size, tokens - g * group_size
                    for h in range(x.shape[1]):
                        per_head(x, into, bh, chunk, h, block, lanes, start, n)
        return kernel

    f32, stored = np.float32, array(scale_dtype, 3, "A")
    place = (types.int64,) * 4  # offset, tokens, chunks, per
    signatures = (
        types.void(array(f32, 3), array(np.uint8, 3, "A"), stored, stored, array(f32, 1),
                   array(f32, 3), *place),
        types.void(array(f32, 3), array(np.uint8, 3, "A"), stored, stored, array(f32, 1),
                   array(f32, 4), *place),
    )
    bodies = [over_groups(per_head) for per_head in (score_head, value_head)]
    return {parallel: tuple(njit(signature, parallel=parallel, fastmath=FAST)(body)
                            for signature, body in zip(signatures, bodies))
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
