"""decode_attention over a layer's cache segments: the kernels' arguments, split plan, launches."""
from __future__ import annotations

import torch
import triton.language as tl

from kvbench.kernels import interpreting
from kvbench.kernels.formats import (
    IntQFormat, KernelFormat, KVSegment, check_decode_shapes, token_axis,
)
from kvbench.kernels.triton.attention import launch_split, merge
from kvbench.kernels.triton.common import log2, next_power_of_two

RAW, INTQ, LLOYDMAX, TURBO = 0, 1, 2, 3
SPLIT_UNIT = 64  # tokens per split are a multiple of this (of every attention.TILE_CONFIGS tile)
PROGRAMS_PER_SM = 4  # split programs per multiprocessor: more hide more memory latency

_DOT_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def token_rows(t: torch.Tensor, axis: int) -> tuple[torch.Tensor, list[int]]:
    """t and its (batch, head, token) strides, `axis` its token axis: read in place (a view of a
    bigger buffer included) where the dims after the token axis are dense, else copied."""
    dense = 1
    for size, stride in zip(reversed(t.shape[axis + 1:]), reversed(t.stride()[axis + 1:])):
        if size > 1 and stride != dense:
            t = t.contiguous()
            break
        dense *= size
    return t, [t.stride(0), t.stride(1), t.stride(axis)]


def side_args(side, fmt: KernelFormat | None, dim: int) -> tuple[list, list, dict, float]:
    """(pointer args p0 p1 p2 tab d1 d2, strides of p0 p1 p2 (batch, head, token), constexprs,
    scale) of one side."""
    if fmt is None:
        side, strides = token_rows(side, -2)
        return ([side] * 6, strides + [0] * 6,
                {"KIND": RAW, "BITS": 1, "GROUP": 1, "BYTES": 1, "GROUPS": 1, "LOG2": 0,
                 "BYTES_P2": 1, "FOLD": False}, 1.0)
    reason = fmt.attention_unsupported()
    if reason:
        raise ValueError(f"the fused attention cannot read {fmt}: {reason}")
    codes, code_strides = token_rows(side["codes"], token_axis(fmt, "codes"))
    if isinstance(fmt, IntQFormat):
        scale, scale_strides = token_rows(side["scale"], -2)
        low, low_strides = token_rows(side["min"], -2)
        return ([codes, scale, low, codes, codes, codes],
                code_strides + scale_strides + low_strides,
                {"KIND": INTQ, "BITS": fmt.bits, "GROUP": fmt.group_size,
                 "BYTES": codes.shape[-1], "GROUPS": scale.shape[-1], "LOG2": 0,
                 "BYTES_P2": 1, "FOLD": False}, 1.0)
    centroids, _, d1, d2 = fmt.tables(codes.device)
    norm, norm_strides = token_rows(side[fmt.norm_name], -2)
    kind = TURBO if fmt.kind == "turbo" else LLOYDMAX
    return ([codes, norm, norm, centroids, d1, d2], code_strides + norm_strides + [0] * 3,
            {"KIND": kind, "BITS": fmt.bits, "GROUP": fmt.block, "BYTES": codes.shape[-1],
             "GROUPS": dim // fmt.block, "LOG2": log2(fmt.block),
             "BYTES_P2": next_power_of_two(fmt.bits), "FOLD": fmt.block == dim}, fmt.scale32)


def plan(tokens: int, splits: int | None, programs: int, device: torch.device) -> tuple[int, int]:
    """(tokens per split, splits) of a segment's `tokens` read by `programs` (sequence, KV head)
    programs, whole SPLIT_UNITs each: `splits` asked for, by default enough that about
    PROGRAMS_PER_SM programs run per multiprocessor, none shorter than a tile."""
    units = (torch.cuda.get_device_properties(device).multi_processor_count
             if device.type == "cuda" else 1)
    # ceiling divisions -(-a // b) (host ints: triton.cdiv is slow on the host)
    count = splits or max(1, min(-(-PROGRAMS_PER_SM * units // programs), -(-tokens // SPLIT_UNIT)))
    per_split = SPLIT_UNIT * max(1, -(-tokens // (count * SPLIT_UNIT)))
    return per_split, -(-tokens // per_split)


def query_constants(q: torch.Tensor, kv_heads: int) -> dict:
    """The constexprs _split and _combine take from a query (batch, q_heads, dim) over
    kv_heads: its sizes, and the dtypes its dots round to and run in."""
    dim, group = q.shape[-1], q.shape[1] // kv_heads
    round_dtype = _DOT_DTYPES[q.dtype]
    # the interpreter's tl.dot cannot take bfloat16 (_operand); float32 dots stay float32
    dot_dtype = tl.float32 if interpreting() and q.dtype == torch.bfloat16 else round_dtype
    return {"D": dim, "D_P2": max(16, next_power_of_two(dim)), "GROUP": group,
            "GP": max(16, next_power_of_two(group)), "ROUND_DTYPE": round_dtype,
            "DOT_DTYPE": dot_dtype, "PRECISION": "ieee" if dot_dtype == tl.float32 else "tf32"}


def partials(programs: int, n_splits: int, consts: dict, device: torch.device):
    """(m, l, acc): the splits' partial softmaxes, float32, for _split to fill."""
    m = torch.empty(programs, n_splits, consts["GP"], dtype=torch.float32, device=device)
    return m, torch.empty_like(m), m.new_empty(*m.shape, consts["D_P2"])


def check_sinks(sinks: torch.Tensor | None, q_heads: int) -> torch.Tensor | None:
    """sinks as float32, refused unless (q_heads,)."""
    if sinks is not None and tuple(sinks.shape) != (q_heads,):
        raise ValueError(f"sinks must be (q_heads,) = ({q_heads},), got {tuple(sinks.shape)}")
    return None if sinks is None else sinks.float().contiguous()


def decode_attention(query: torch.Tensor, segments: list[KVSegment],
                     bias: torch.Tensor | None = None, scaling: float | None = None,
                     splits: int | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None,
                     window: int | None = None) -> torch.Tensor:
    """softmax(query K^T * scaling + bias) V over the segments' tokens, in order, for one query
    token per sequence.

    query (batch, q_heads, head_dim) or (batch, q_heads, 1, head_dim); every segment holds
    (batch, kv_heads, tokens, head_dim) keys and values, q_heads a multiple of kv_heads (GQA);
    bias None or (batch, kv_heads, all tokens). splits: per segment (default: enough programs
    to fill the device). softcap: the logits q k^T * scaling become softcap * tanh(logits /
    softcap) before the bias. sinks (q_heads,): one more logit per query head in the softmax,
    with no value. window: only the newest `window` tokens are attended. Returns query's shape
    and dtype.
    """
    shape = query.shape
    q = query.reshape(shape[0], shape[1], shape[-1]).contiguous()
    batch, q_heads, dim = q.shape
    kv_heads, total = check_decode_shapes(segments, batch, q_heads, bias)
    if bias is not None:
        bias = bias.float().contiguous()
    sinks = check_sinks(sinks, q_heads)
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    first = 0 if window is None else max(0, total - window)  # the first token attended
    scaling = dim ** -0.5 if scaling is None else scaling
    consts = query_constants(q, kv_heads)
    programs = batch * kv_heads
    plans, offset = [], 0
    for segment in map(KVSegment.trimmed, segments):
        n = segment.tokens
        start = min(n, max(0, first - offset))  # splits only over the window's tokens
        per_split, count = plan(n - start, splits, programs, q.device)
        plans.append((segment, n, start, offset, per_split, count))
        offset += n
    n_splits = sum(p[-1] for p in plans)
    out = partials(programs, n_splits, consts, q.device)
    first_split = 0
    for segment, n, start, offset, per_split, count in plans:
        if count:
            launch_split((programs, count), q, side_args(segment.keys, segment.key_format, dim),
                         side_args(segment.values, segment.value_format, dim), bias, out, None,
                         (n, start, per_split, first_split, n_splits, offset, total), kv_heads,
                         scaling, softcap, consts)
        first_split += count
    return merge(out, sinks, q, kv_heads, consts).reshape(shape)
