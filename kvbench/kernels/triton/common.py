"""Triton building blocks shared by the codec and attention kernels. Every float operation here
rounds as its torch reference does (IEEE division and square root, no fused multiply-add: the
kernels are launched with enable_fp_fusion=False), so codes and norms come out bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels import interpreting

# Launch options every kernel takes: a*b+c stays two roundings, as in torch.
LAUNCH = {"enable_fp_fusion": False}


def next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def log2(n: int) -> int:
    return n.bit_length() - 1


def check_device(*tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"the kernel's tensors are on several devices: {sorted(map(str, devices))}")


@triton.jit
def pairwise_sum(x, LOG2: tl.constexpr):
    """(M, 2**LOG2) -> (M,): adjacent pairs added level by level (kvbench.methods.rounding)."""
    for _ in tl.static_range(LOG2):
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        x = a + b
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def fwht_rows(x, N: tl.constexpr, LOG2: tl.constexpr, sqrt_n):
    """Orthonormal Walsh-Hadamard transform of each row of x (M, N), N = 2**LOG2, with the
    butterflies of kvbench.methods.rotation.fwht in its order, then divided by sqrt_n."""
    for level in tl.static_range(LOG2):
        y = tl.reshape(x, (x.shape[0], N // (2 << level), 2, 1 << level))
        a, b = tl.split(tl.permute(y, (0, 1, 3, 2)))
        y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        x = tl.reshape(y, (x.shape[0], N))
    return tl.math.div_rn(x, sqrt_n)


# Whether the kernels below run in Triton's interpreter: fixed when this module is imported, as
# triton.jit itself decides it then.
INTERPRET: tl.constexpr = tl.constexpr(interpreting())


@triton.jit
def cast(x, dtype: tl.constexpr):
    """x as dtype. The interpreter truncates float32 to bfloat16; there it is rounded to nearest
    even on the bits instead, as torch and a GPU's conversion round (NaN is not kept apart: the
    codecs never make one from finite input)."""
    if INTERPRET and x.dtype == tl.float32 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def round_half_even(x):
    """torch.round for |x| < 2**22: adding 1.5 * 2**23 leaves no fraction bits to keep."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def count_below(y, bounds_ptr, N_BOUNDS: tl.constexpr):
    """int32 code of every element: how many bounds lie strictly below it (Codebook.quantize)."""
    idx = tl.zeros(y.shape, dtype=tl.int32)
    for k in range(N_BOUNDS):
        idx += (y > tl.load(bounds_ptr + k)).to(tl.int32)
    return idx


@triton.jit
def pack_groups(codes, BITS: tl.constexpr, BYTES_P2: tl.constexpr):
    """Codes (M, W), W a multiple of 8, each < 2**BITS -> bytes (M, W // 8, BYTES_P2) uint8:
    every group of 8 codes fills BITS bytes (the first BITS of the last axis), little-endian,
    as kvbench.methods.packing.pack_bits."""
    groups = tl.reshape(codes.to(tl.uint64), (codes.shape[0], codes.shape[1] // 8, 8))
    slot = tl.arange(0, 8).to(tl.uint64)
    word = tl.sum(groups << (slot * BITS)[None, None, :], axis=2)  # bits do not overlap
    byte = tl.arange(0, BYTES_P2).to(tl.uint64)
    return ((word[:, :, None] >> (byte * 8)[None, None, :]) & 255).to(tl.uint8)


@triton.jit
def unpack_groups(packed, BITS: tl.constexpr, BYTES_P2: tl.constexpr):
    """Bytes (M, G, BYTES_P2), the first BITS of the last axis holding 8 codes (the rest
    zero) -> int32 codes (M, G * 8): the inverse of pack_groups."""
    byte = tl.arange(0, BYTES_P2).to(tl.uint64)
    word = tl.sum(packed.to(tl.uint64) << (byte * 8)[None, None, :], axis=2)
    slot = tl.arange(0, 8).to(tl.uint64)
    codes = (word[:, :, None] >> (slot * BITS)[None, None, :]) & ((1 << BITS) - 1)
    return tl.reshape(codes.to(tl.int32), (packed.shape[0], packed.shape[1] * 8))


@triton.jit
def load_packed_rows(ptr, rows, row_ok, n_bytes, BITS: tl.constexpr, GROUPS: tl.constexpr,
                     BYTES_P2: tl.constexpr):
    """The packed codes of `rows` (int64 (M,)) of a (rows, n_bytes) uint8 array, as
    (M, GROUPS, BYTES_P2) for unpack_groups; bytes past n_bytes read as zero."""
    col = tl.arange(0, GROUPS)[:, None] * BITS + tl.arange(0, BYTES_P2)[None, :]
    ok = (tl.arange(0, BYTES_P2) < BITS)[None, :] & (col < n_bytes)
    return tl.load(ptr + rows[:, None, None] * n_bytes + col[None, :, :],
                   mask=row_ok[:, None, None] & ok[None, :, :], other=0)


@triton.jit
def store_packed_rows(ptr, packed, rows, row_ok, n_bytes, BITS: tl.constexpr,
                      GROUPS: tl.constexpr, BYTES_P2: tl.constexpr):
    """Store pack_groups' bytes (M, GROUPS, BYTES_P2) as rows of a (rows, n_bytes) array."""
    col = tl.arange(0, GROUPS)[:, None] * BITS + tl.arange(0, BYTES_P2)[None, :]
    ok = (tl.arange(0, BYTES_P2) < BITS)[None, :] & (col < n_bytes)
    tl.store(ptr + rows[:, None, None] * n_bytes + col[None, :, :], packed,
             mask=row_ok[:, None, None] & ok[None, :, :])
