"""Encode and decode of the codebook layouts (lloydmax, turbo; kvbench.kernels.formats
.CodebookFormat): one program per BLOCK_M rows, a row being one vector (lloydmax) or one block
(turbo). Writes exactly the bytes of the torch codecs."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels.formats import CodebookFormat, packed_length
from kvbench.kernels.triton.common import (
    LAUNCH, cast, check_device, count_below, fwht_rows, load_packed_rows, log2, next_power_of_two,
    pack_groups, pairwise_sum, store_packed_rows, unpack_groups,
)

BLOCK_M = 32  # rows per program


@triton.jit
def _encode(x_ptr, codes_ptr, norm_ptr, bounds_ptr, table_ptr, d1_ptr, d2_ptr, n_rows, n_bytes,
            scale, BLOCK: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
            BITS: tl.constexpr, BYTES_P2: tl.constexpr, TURBO: tl.constexpr,
            NORM_CORRECTION: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    lanes = tl.arange(0, WIDTH)
    row_ok = rows < n_rows
    lane_ok = lanes < BLOCK
    ok = row_ok[:, None] & lane_ok[None, :]
    v = tl.load(x_ptr + rows[:, None] * BLOCK + lanes[None, :], mask=ok, other=0.0)
    v = v.to(tl.float32)
    gamma = tl.sqrt_rn(pairwise_sum(v * v, LOG2_WIDTH))
    if TURBO:
        u = tl.math.div_rn(v, tl.where(gamma == 0, 1.0, gamma)[:, None])
        d1 = tl.load(d1_ptr + lanes)
        d2 = tl.load(d2_ptr + lanes)
        y = fwht_rows(u * d1[None, :], WIDTH, LOG2_WIDTH, scale) * d2[None, :]
    else:
        # torch.finfo(torch.float32).tiny, as LloydMaxCodec clamps the norm
        y = tl.math.div_rn(v, tl.maximum(gamma, 1.1754943508222875e-38)[:, None]) * scale
    idx = tl.where(ok, count_below(y, bounds_ptr, (1 << BITS) - 1), 0)
    norm = gamma
    if NORM_CORRECTION:
        c = tl.where(ok, tl.load(table_ptr + idx), 0.0)
        c_norm = tl.sqrt_rn(pairwise_sum(c * c, LOG2_WIDTH))
        norm = tl.math.div_rn(gamma, tl.where(c_norm == 0, 1.0, c_norm))
    tl.store(norm_ptr + rows, cast(norm, norm_ptr.dtype.element_ty), mask=row_ok)
    packed = pack_groups(idx, BITS, BYTES_P2)
    store_packed_rows(codes_ptr, packed, rows, row_ok, n_bytes, BITS, WIDTH // 8, BYTES_P2)


@triton.jit
def _decode(codes_ptr, norm_ptr, table_ptr, d1_ptr, d2_ptr, out_ptr, n_rows, n_bytes, scale,
            BLOCK: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
            BITS: tl.constexpr, BYTES_P2: tl.constexpr, TURBO: tl.constexpr,
            BLOCK_M: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    lanes = tl.arange(0, WIDTH)
    row_ok = rows < n_rows
    ok = row_ok[:, None] & (lanes < BLOCK)[None, :]
    packed = load_packed_rows(codes_ptr, rows, row_ok, n_bytes, BITS, WIDTH // 8, BYTES_P2)
    c = tl.load(table_ptr + unpack_groups(packed, BITS, BYTES_P2))
    norm = tl.load(norm_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if TURBO:
        d1 = tl.load(d1_ptr + lanes)
        d2 = tl.load(d2_ptr + lanes)
        v = fwht_rows(c * d2[None, :], WIDTH, LOG2_WIDTH, scale) * d1[None, :]
    else:
        v = tl.math.div_rn(c, scale)
    v = v * norm[:, None]
    tl.store(out_ptr + rows[:, None] * BLOCK + lanes[None, :], cast(v, out_ptr.dtype.element_ty),
             mask=ok)


def _shape(fmt: CodebookFormat) -> dict:
    width = max(8, next_power_of_two(fmt.block))
    if fmt.kind == "turbo" and width != fmt.block:
        raise ValueError(f"turbo kernels need a power-of-two block of at least 8, got {fmt.block}")
    return {"BLOCK": fmt.block, "WIDTH": width, "LOG2_WIDTH": log2(width), "BITS": fmt.bits,
            "BYTES_P2": next_power_of_two(fmt.bits), "TURBO": fmt.kind == "turbo",
            "BLOCK_M": BLOCK_M}


def layout_shapes(fmt: CodebookFormat, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """(codes shape, norm shape) of x of `shape` (..., tokens, D), as the torch codecs store."""
    lead, dim = shape[:-1], shape[-1]
    n_bytes = packed_length(fmt.block, fmt.bits)
    if fmt.kind == "lloydmax":
        return (*lead, n_bytes), (*lead, 1)
    return (*lead, dim // fmt.block, n_bytes), (*lead, dim // fmt.block)


def encode(x: torch.Tensor, fmt: CodebookFormat) -> dict[str, torch.Tensor]:
    """The torch codec's stored tensors of x (..., tokens, D): {"codes", fmt.norm_name}."""
    if x.shape[-1] % fmt.block:
        raise ValueError(f"head_dim {x.shape[-1]} is not a multiple of block {fmt.block}")
    x = x.contiguous()
    codes_shape, norm_shape = layout_shapes(fmt, tuple(x.shape))
    codes = torch.empty(codes_shape, dtype=torch.uint8, device=x.device)
    norm = torch.empty(norm_shape, dtype=fmt.norm_dtype, device=x.device)
    rows = x.numel() // fmt.block
    if rows:
        centroids, bounds, d1, d2 = fmt.tables(x.device)
        _encode[(triton.cdiv(rows, BLOCK_M),)](
            x, codes, norm, bounds, centroids, d1, d2, rows, codes.shape[-1], fmt.scale32,
            NORM_CORRECTION=fmt.norm_correction, **_shape(fmt), **LAUNCH)
    return {"codes": codes, fmt.norm_name: norm}


def decode(tensors: dict[str, torch.Tensor], fmt: CodebookFormat, shape: tuple[int, ...],
           dtype: torch.dtype) -> torch.Tensor:
    """x_hat of `shape` and `dtype` from the stored tensors, as the torch codec decodes."""
    codes, norm = tensors["codes"].contiguous(), tensors[fmt.norm_name].contiguous()
    check_device(codes, norm)
    out = torch.empty(shape, dtype=dtype, device=codes.device)
    rows = out.numel() // fmt.block
    if rows:
        centroids, _, d1, d2 = fmt.tables(codes.device)
        _decode[(triton.cdiv(rows, BLOCK_M),)](
            codes, norm, centroids, d1, d2, out, rows, codes.shape[-1], fmt.scale32,
            **_shape(fmt), **LAUNCH)
    return out

