"""Encode and decode of intq's layout (kvbench.kernels.formats.IntQFormat), both axes: one program
per BLOCK_M rows x a run of whole groups along them. Writes exactly the bytes of IntQCodec.

Rows are tokens over channels (axis "token") or channels over tokens (axis "channel"); either
way the packed arrays are row-major (rows, bytes) and (rows, groups), and element p of row r
sits in x at (r // rows_per_lead) * stride_lead + (r % rows_per_lead) * stride_row + p *
stride_pos.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels.formats import IntQFormat, packed_length
from kvbench.kernels.triton.common import (
    LAUNCH, cast, check_device, next_power_of_two, round_half_even,
)

BLOCK_M = 16  # rows per program
POSITIONS = 256  # values along a row per program (whole groups)


@triton.jit
def _element_offsets(rows, positions, rows_per_lead, stride_lead, stride_row, stride_pos):
    base = (rows // rows_per_lead) * stride_lead + (rows % rows_per_lead) * stride_row
    return base[:, None, None] + positions[None, :, :].to(tl.int64) * stride_pos


@triton.jit
def _program_tile(n_rows, GROUP: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's rows (int64), its groups along them, the positions of their values
    (GROUPS, GROUP), and which rows exist."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    positions = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    return rows, groups, positions, rows < n_rows


@triton.jit
def _encode(x_ptr, codes_ptr, scale_ptr, min_ptr, n_rows, length, n_bytes, n_groups,
            rows_per_lead, stride_lead, stride_row, stride_pos, BITS: tl.constexpr,
            GROUP: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr):
    rows, groups, positions, row_ok = _program_tile(n_rows, GROUP, GROUPS, BLOCK_M)
    ok = row_ok[:, None, None] & (positions < length)[None, :, :]
    offsets = _element_offsets(rows, positions, rows_per_lead, stride_lead, stride_row,
                               stride_pos)
    x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    # A group's min and max over its values (a trailing partial group over the ones it has).
    group_ok = row_ok[:, None] & (groups < n_groups)[None, :]
    lo = tl.where(group_ok, tl.min(tl.where(ok, x, float("inf")), axis=2), 0.0)
    hi = tl.where(group_ok, tl.max(tl.where(ok, x, float("-inf")), axis=2), 0.0)
    levels: tl.constexpr = (1 << BITS) - 1
    scale = tl.math.div_rn(hi - lo, float(levels)).to(tl.float16)
    zero = lo.to(tl.float16)
    divisor = tl.where(scale == 0, 1.0, scale.to(tl.float32))
    q = tl.math.div_rn(x - zero.to(tl.float32)[:, :, None], divisor[:, :, None])
    q = tl.minimum(tl.maximum(round_half_even(q), 0.0), float(levels))
    q = tl.where(ok, q, 0.0).to(tl.uint32)
    per: tl.constexpr = 8 // BITS  # codes per byte
    q = tl.reshape(q, (BLOCK_M, GROUPS, GROUP // per, per))
    shift = (tl.arange(0, per) * BITS).to(tl.uint32)
    byte = tl.sum(q << shift[None, None, None, :], axis=3).to(tl.uint8)  # bits do not overlap
    byte_col = groups[:, None] * (GROUP // per) + tl.arange(0, GROUP // per)[None, :]
    tl.store(codes_ptr + rows[:, None, None] * n_bytes + byte_col[None, :, :], byte,
             mask=row_ok[:, None, None] & (byte_col < n_bytes)[None, :, :])
    at = rows[:, None] * n_groups + groups[None, :]
    tl.store(scale_ptr + at, scale, mask=group_ok)
    tl.store(min_ptr + at, zero, mask=group_ok)


@triton.jit
def _decode(codes_ptr, scale_ptr, min_ptr, out_ptr, n_rows, length, n_bytes, n_groups,
            rows_per_lead, stride_lead, stride_row, stride_pos, BITS: tl.constexpr,
            GROUP: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr):
    rows, groups, positions, row_ok = _program_tile(n_rows, GROUP, GROUPS, BLOCK_M)
    group_ok = row_ok[:, None] & (groups < n_groups)[None, :]
    per: tl.constexpr = 8 // BITS
    byte_col = groups[:, None] * (GROUP // per) + tl.arange(0, GROUP // per)[None, :]
    byte = tl.load(codes_ptr + rows[:, None, None] * n_bytes + byte_col[None, :, :],
                   mask=row_ok[:, None, None] & (byte_col < n_bytes)[None, :, :], other=0)
    shift = (tl.arange(0, per) * BITS).to(tl.uint32)
    q = (byte.to(tl.uint32)[:, :, :, None] >> shift[None, None, None, :]) & ((1 << BITS) - 1)
    q = tl.reshape(q, (BLOCK_M, GROUPS, GROUP)).to(tl.float32)
    at = rows[:, None] * n_groups + groups[None, :]
    scale = tl.load(scale_ptr + at, mask=group_ok, other=0.0).to(tl.float32)
    zero = tl.load(min_ptr + at, mask=group_ok, other=0.0).to(tl.float32)
    x = q * scale[:, :, None] + zero[:, :, None]  # two roundings: launched without FMA
    ok = row_ok[:, None, None] & (positions < length)[None, :, :]
    offsets = _element_offsets(rows, positions, rows_per_lead, stride_lead, stride_row,
                               stride_pos)
    tl.store(out_ptr + offsets, cast(x, out_ptr.dtype.element_ty), mask=ok)


def _geometry(fmt: IntQFormat, shape: tuple[int, ...]) -> dict:
    """Rows, row length and element strides of a contiguous x of `shape` (..., tokens, D)."""
    tokens, dim = shape[-2], shape[-1]
    lead = 1
    for n in shape[:-2]:
        lead *= n
    if fmt.axis == "token":
        return {"n_rows": lead * tokens, "length": dim, "rows_per_lead": max(lead * tokens, 1),
                "stride_lead": 0, "stride_row": dim, "stride_pos": 1}
    return {"n_rows": lead * dim, "length": tokens, "rows_per_lead": dim,
            "stride_lead": tokens * dim, "stride_row": 1, "stride_pos": dim}


def _launch(kernel, fmt: IntQFormat, geometry: dict, *tensors) -> None:
    length = geometry["length"]
    n_groups = -(-length // fmt.group_size)
    groups = min(next_power_of_two(n_groups), max(1, POSITIONS // fmt.group_size))
    grid = (triton.cdiv(geometry["n_rows"], BLOCK_M), triton.cdiv(n_groups, groups))
    kernel[grid](*tensors, geometry["n_rows"], length, packed_length(length, fmt.bits),
                 n_groups, geometry["rows_per_lead"], geometry["stride_lead"],
                 geometry["stride_row"], geometry["stride_pos"], BITS=fmt.bits,
                 GROUP=fmt.group_size, GROUPS=groups, BLOCK_M=BLOCK_M, **LAUNCH)


def layout_shapes(fmt: IntQFormat, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """(codes shape, scale/min shape) of x of `shape`, as IntQCodec stores them."""
    tokens, dim = shape[-2], shape[-1]
    if fmt.axis == "token":
        rows, length = (*shape[:-1],), dim
    else:
        rows, length = (*shape[:-2], dim), tokens
    return ((*rows, packed_length(length, fmt.bits)), (*rows, -(-length // fmt.group_size)))


def encode(x: torch.Tensor, fmt: IntQFormat) -> dict[str, torch.Tensor]:
    """IntQCodec's stored tensors of x (..., tokens, D): {"codes", "scale", "min"}."""
    x = x.contiguous()
    codes_shape, group_shape = layout_shapes(fmt, tuple(x.shape))
    codes = torch.empty(codes_shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(group_shape, dtype=torch.float16, device=x.device)
    zero = torch.empty_like(scale)
    geometry = _geometry(fmt, tuple(x.shape))
    if x.numel():
        _launch(_encode, fmt, geometry, x, codes, scale, zero)
    return {"codes": codes, "scale": scale, "min": zero}


def decode(tensors: dict[str, torch.Tensor], fmt: IntQFormat, shape: tuple[int, ...],
           dtype: torch.dtype) -> torch.Tensor:
    """x_hat of `shape` and `dtype` from IntQCodec's stored tensors."""
    codes, scale, zero = (tensors[k].contiguous() for k in ("codes", "scale", "min"))
    check_device(codes, scale, zero)
    out = torch.empty(shape, dtype=dtype, device=codes.device)
    if out.numel():
        _launch(_decode, fmt, _geometry(fmt, tuple(shape)), codes, scale, zero, out)
    return out
