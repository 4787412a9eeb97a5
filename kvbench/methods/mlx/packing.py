"""b-bit codes packed into bytes on MLX: the bit layout of kvbench.methods.torch.packing.

Code i of a row occupies bits [i*b, (i+1)*b) of the row's little-endian bit stream (bit k is bit
k % 8 of byte k // 8). Rows are cut into groups of 8 codes, which fill exactly b bytes; each of
those b bytes is the OR of the shifted codes that land in it, built for all groups at once. The
only Python loop is over the 8 slots of a group, never over codes.
"""
from __future__ import annotations

import mlx.core as mx

from kvbench.kernels.formats import check_bits, check_packed, code_slots, packed_length

__all__ = ["pack_bits", "unpack_bits", "packed_length"]


def _pad_last(x: mx.array, extra: int) -> mx.array:
    if not extra:
        return x
    return mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def pack_bits(indices: mx.array, bits: int, check: bool = False) -> mx.array:
    """Pack uint8 codes (..., n), each < 2**bits, into uint8 (..., ceil(n * bits / 8)).

    Codes of 2**bits or more are refused only with check=True: the check evaluates `indices`,
    which an encode that builds a lazy graph should not do (the codecs' codes are in range by
    construction)."""
    check_bits(bits)
    if indices.dtype != mx.uint8:
        raise ValueError(f"indices must be uint8, got {indices.dtype}")
    if check and mx.any(indices >> bits).item():
        raise ValueError(f"indices must be below 2**bits = {1 << bits}")
    n = indices.shape[-1]
    groups = -(-n // 8)
    codes = _pad_last(indices, groups * 8 - n).reshape(*indices.shape[:-1], groups, 8)
    parts: list[list[mx.array]] = [[] for _ in range(bits)]
    for j, byte, shift, spills in code_slots(bits):
        code = codes[..., j]
        parts[byte].append(code << shift)  # uint8: bits past this byte fall off
        if spills:
            parts[byte + 1].append(code >> (8 - shift))
    out_bytes = []
    for contributions in parts:
        acc = contributions[0]
        for c in contributions[1:]:
            acc = acc | c
        out_bytes.append(acc)
    out = mx.stack(out_bytes, axis=-1).reshape(*indices.shape[:-1], groups * bits)
    # Padding codes are zero, so the dropped tail bytes hold no information.
    return out[..., : packed_length(n, bits)]


def unpack_bits(packed: mx.array, bits: int, n: int) -> mx.array:
    """Inverse of pack_bits: uint8 (..., ceil(n * bits / 8)) -> uint8 codes (..., n)."""
    check_packed(packed.shape[-1], n, bits)
    groups = -(-n // 8)
    grouped = _pad_last(packed, groups * bits - packed.shape[-1])
    grouped = grouped.reshape(*packed.shape[:-1], groups, bits)
    mask = (1 << bits) - 1
    codes = []
    for j, byte, shift, spills in code_slots(bits):
        code = grouped[..., byte] >> shift
        if spills:
            code = code | (grouped[..., byte + 1] << (8 - shift))
        codes.append(code & mask)
    out = mx.stack(codes, axis=-1).reshape(*packed.shape[:-1], groups * 8)
    return out[..., :n]
