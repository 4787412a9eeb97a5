"""b-bit codes packed contiguously into bytes, little-endian bit order, spanning byte boundaries.

Code i of a row occupies bits [i*b, (i+1)*b) of the row's little-endian bit stream (bit k of the
stream is bit k % 8 of byte k // 8). Any 8 consecutive codes fill exactly b bytes, so rows are cut
into groups of 8 codes and the same few shifts run on every group at once: packing sums a group's
shifted codes in one 64-bit word; unpacking loops over the 8 slots of a group, never over codes.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from kvbench.kernels.formats import check_bits, check_packed, code_slots, packed_length


if sys.byteorder != "little":  # pack_bits reads a word's bytes in memory order
    raise ImportError("kvbench's torch packing assumes a little-endian machine")


def _pad_last(x: torch.Tensor, extra: int) -> torch.Tensor:
    """Zero-pad the last dim; F.pad copies even when there is nothing to add."""
    return F.pad(x, (0, extra)) if extra else x


def pack_bits(indices: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes (..., n), each < 2**bits, into uint8 (..., ceil(n * bits / 8))."""
    check_bits(bits)
    if indices.dtype != torch.uint8:
        raise ValueError(f"indices must be uint8, got {indices.dtype}")
    if (indices >> bits).any():
        raise ValueError(f"indices must be below 2**bits = {1 << bits}")
    n = indices.shape[-1]
    groups = -(-n // 8)
    codes = _pad_last(indices, groups * 8 - n).unflatten(-1, (groups, 8))
    # a group's 8 codes side by side in one 64-bit word (the fields do not overlap, so the sum
    # is their OR; 8-bit codes wrap past the sign bit, bit for bit); its low `bits` bytes, in
    # memory order on a little-endian machine, are the group's packed bytes
    shifts = torch.arange(0, 8 * bits, bits, dtype=torch.int64, device=indices.device)
    words = (codes.to(torch.int64) << shifts).sum(-1, keepdim=True)
    out = words.view(torch.uint8)[..., :bits]
    # Padding codes are zero, so the dropped tail bytes hold no information.
    return out.flatten(-2)[..., : packed_length(n, bits)].contiguous()


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of pack_bits: uint8 (..., ceil(n * bits / 8)) -> uint8 codes (..., n)."""
    check_packed(packed.shape[-1], n, bits)
    groups = -(-n // 8)
    grouped = _pad_last(packed, groups * bits - packed.shape[-1]).unflatten(-1, (groups, bits))
    codes = torch.empty(*grouped.shape[:-1], 8, dtype=torch.uint8, device=packed.device)
    for j, byte, shift, spills in code_slots(bits):
        code = grouped[..., byte] >> shift
        if spills:
            code |= grouped[..., byte + 1] << (8 - shift)
        codes[..., j] = code & ((1 << bits) - 1)
    return codes.flatten(-2)[..., :n]
