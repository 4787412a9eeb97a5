"""The fused decode attention of a batched decode step (kvbench.models.batch_step) on the Triton
kernels: every row's one query over its own cache (its own allocations, its own length) in a few
launches per layer, whatever the number of rows; the twin of kvbench.kernels.cpu.batched.

Rows whose segments have the same formats in the same order (row_formats, which the caller
groups a step's rows by: kvbench.models.attention) are read together: one _split launch per segment position (slot) over all of
them, then one _combine. A slot's launch gets a table, one line of LINE int64s per row: the
addresses of the row's tensors with their head and token strides (in elements), then its token
count and split plan; the kernel casts the addresses to pointers of the tensors' element types.
Each row is split as decode_attention splits it alone (its length, one sequence): the grid is
(rows x KV heads, the most splits a row has at the slot), a program past its row's splits
stores an empty partial after the row's real ones, and the merge passes over those. So row i's
output is decode_attention(query[i:i+1], rows[i]) bit for bit (tested), whatever rows share the
step. The host's part is a line per row and slot (~15 us of Python each, on a CPU core here,
against a decode_attention call per row before, which costs about as much, plus its launches).
"""
from __future__ import annotations

import torch

from kvbench.kernels.formats import IntQFormat, KVSegment, check_decode_shapes, token_axis
from kvbench.kernels.triton.attention import launch_split, merge
from kvbench.kernels.triton.segments import (
    check_sinks, partials, plan, query_constants, side_args, token_rows,
)

# A row's line: (address, head stride, token stride) of k0 k1 k2 v0 v1 v2 (side_args' p0 p1 p2
# of the keys, then of the values); its tokens at the slot, tokens per split, the place of its
# first split there, its splits there, and where its empty partials go (less the split's index).
TOKENS, PER_SPLIT, FIRST_SPLIT, SPLITS, EMPTY, LINE = 18, 19, 20, 21, 22, 24


def row_formats(segments: list[KVSegment]) -> tuple | None:
    """What decode_attention_rows groups rows by: per segment in order, its key and value
    formats (None: raw) with the dtypes of their tensors; None for a row it cannot read (no
    segment, a batch of more than one sequence, a layout the fused attention cannot read)."""
    if not segments:
        return None
    key = []
    for segment in segments:
        for side, fmt in ((segment.keys, segment.key_format),
                          (segment.values, segment.value_format)):
            if fmt is not None and fmt.attention_unsupported():
                return None
            tensors = [side] if fmt is None else [side[name] for name in sorted(side)]
            if tensors[0].shape[0] != 1:
                return None
            key.append((fmt, tuple(t.dtype for t in tensors)))
    return tuple(key)


def decode_attention_rows(query: torch.Tensor, rows: list[list[KVSegment]],
                          scaling: float | None = None, softcap: float | None = None,
                          sinks: torch.Tensor | None = None,
                          splits: int | None = None) -> torch.Tensor:
    """Row i of query (rows, q_heads, [1,] head_dim) attended over rows[i]'s segments (each
    (1, kv_heads, tokens, head_dim) keys and values, raw or packed, anywhere in memory): what
    decode_attention(query[i:i + 1], rows[i], scaling=scaling, splits=splits, softcap=softcap,
    sinks=sinks) gives, bit for bit. Every row must have the same row_formats (ValueError
    otherwise). Returns query's shape and dtype."""
    shape = query.shape
    q = query.reshape(shape[0], shape[1], shape[-1]).contiguous()
    count, q_heads, dim = q.shape
    if len(rows) != count:
        raise ValueError(f"{count} queries for {len(rows)} rows")
    keys = {row_formats(segments) for segments in rows}
    if len(keys) != 1 or None in keys:
        raise ValueError("decode_attention_rows reads rows of one structure (the same formats, "
                         "segment by segment, batch 1 each): group them by row_formats")
    rows = [[segment.trimmed() for segment in segments] for segments in rows]
    kv_heads = {check_decode_shapes(segments, 1, q_heads, None)[0] for segments in rows}
    if len(kv_heads) != 1:
        raise ValueError(f"rows of different KV heads: {sorted(kv_heads)}")
    kv_heads = kv_heads.pop()
    sinks = check_sinks(sinks, q_heads)
    scaling = dim ** -0.5 if scaling is None else scaling
    consts = query_constants(q, kv_heads)
    plans = [[plan(s.tokens, splits, kv_heads, q.device) for s in segments] for segments in rows]
    widths = [max(row_plan[slot][1] for row_plan in plans) for slot in range(len(rows[0]))]
    out = partials(count * kv_heads, sum(widths), consts, q.device)
    lines, launches, keep, first = [], [], [], 0
    for slot, width in enumerate(widths):
        # the constexprs and element types from a row with tokens at the slot
        typed = next((row[slot] for row, row_plan in zip(rows, plans) if row_plan[slot][1]),
                     rows[0][slot])
        shapes = _shapes(typed)
        lines.append([_line(row[slot], shapes, row_plan, slot, first, keep)
                      for row, row_plan in zip(rows, plans)])
        if width:
            launches.append((slot, width, _typed(typed.keys, typed.key_format, dim),
                             _typed(typed.values, typed.value_format, dim)))
        first += width
    table = torch.tensor(lines, dtype=torch.int64)
    if q.device.type == "cuda":  # pinned, the copy queued on the stream: no wait for the GPU
        table = table.pin_memory().to(q.device, non_blocking=True)
    for slot, width, key_side, value_side in launches:
        launch_split((count * kv_heads, width), q, key_side, value_side, None, out, table[slot],
                     (0, 0, 0, 0, sum(widths), 0, 0), kv_heads, scaling, softcap, consts)
    return merge(out, sinks, q, kv_heads, consts).reshape(shape)


def _typed(side, fmt, dim: int) -> tuple:
    """side_args for a slot's launch: its tensors give the element types, the table the places
    and strides (zeros here: no compile for each row's strides)."""
    args, _, constants, scale = side_args(side, fmt, dim)
    return args, [0] * 9, constants, scale


def _read(segment: KVSegment) -> list[tuple[torch.Tensor, int]]:
    """(tensor, token axis) of side_args' p0 p1 p2 of the keys, then of the values."""
    read = []
    for side, fmt in ((segment.keys, segment.key_format), (segment.values, segment.value_format)):
        if fmt is None:
            read += [(side, -2)] * 3
        else:
            names = ("codes", "scale", "min") if isinstance(fmt, IntQFormat) else \
                ("codes", fmt.norm_name, fmt.norm_name)
            read += [(side[name], token_axis(fmt, name)) for name in names]
    return read


def _shapes(segment: KVSegment) -> list[tuple]:
    """The shapes of a segment's tensors (_read's) but the batch and its tokens."""
    return [(t.shape[1], *t.shape[axis + 1:]) for t, axis in _read(segment)]


def _line(segment: KVSegment, shapes: list[tuple], row_plan: list[tuple[int, int]], slot: int,
          first: int, keep: list) -> list[int]:
    """A row's line of the table of `slot` (`first`: the place of the slot's first split in
    every row's partials), its tensors of `shapes` (ValueError else). A tensor copied to be read
    (token_rows: not dense after its token axis) goes in `keep` until it is read."""
    line, places = [], {}
    for (tensor, axis), want in zip(_read(segment), shapes):
        if id(tensor) not in places:  # raw: the same tensor thrice; a codebook's norms twice
            if (tensor.shape[1], *tensor.shape[axis + 1:]) != want:
                raise ValueError(f"a row's {tuple(tensor.shape)} tensor is not like the first's"
                                 f" {want} (but the tokens)")
            read, strides = token_rows(tensor, axis)
            if read is not tensor:
                keep.append(read)
            places[id(tensor)] = [read.data_ptr(), *strides[1:]]
        line += places[id(tensor)]
    per_split, count = row_plan[slot]
    own_first = sum(c for _, c in row_plan[:slot])  # where decode_attention puts them
    row_splits = sum(c for _, c in row_plan)
    # the slot's empty partials after the row's real splits and its earlier slots' empty ones
    empty = row_splits + (first - own_first) - count
    return line + [segment.tokens, per_split, own_first, count, empty] + \
        [0] * (LINE - EMPTY - 1)
