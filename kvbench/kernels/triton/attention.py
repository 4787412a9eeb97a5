"""Fused decode attention over packed K/V (flash-decoding): one query token per sequence reads a
layer's cache as it is stored (segments of packed or raw tokens) without decoding it into
memory, split over the tokens, then one pass merges the splits' partial softmaxes.

Per (sequence, KV head, split) a program holds the query heads that share the KV head (GQA),
and per tile of BLOCK_N tokens unpacks K, scores, updates a running max and sum, unpacks V and
accumulates. intq and lloydmax tiles are decoded as their codecs decode (then cast to the
query's dtype, as the decoded cache would be); turbo stays in the rotated domain: the query is
rotated once (R q), the scores are (R q) . (c * norm), and the values are summed as c * norm and
turned back (R^T) once per split. An additive key bias (-inf hides a key) is added to the
scores. Numerically it matches softmax(q K^T * scaling + bias) V on the decoded K/V within the
rounding of the dtype (tested against that, on the torch reference's decoded K/V).

What the models' own attention adds to that (kvbench.models.attention.biased_attention): a
softcap (Gemma 2) in the splits, learned sinks (gpt-oss) once in the merge (a logit with no
value), and a sliding window, which launches splits only over its tokens, so a windowed read
costs only the window's bytes. Packed tensors are read through their batch, head and token
strides: a cache's view of the first tokens of a bigger buffer is read in place, not copied.
kvbench.kernels.triton.segments launches them over one cache (decode_attention);
kvbench.kernels.triton.rows reads a batched step's rows, each its own cache, in the same
launches (FROM_TABLE: a table of the rows' addresses).

Tried on an H200 (2026-11-28) and slower, so not taken: reading packed tiles as eight planes
of dims 8g + s with batched dots (no reshape of a tile; 2x slower), and more than 4 split
programs per multiprocessor (ci/attention_sweep.py: 8 and 16 ran 5-45% slower).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kvbench.kernels import interpreting
from kvbench.kernels.triton.common import LAUNCH, cast, fwht_rows, unpack_groups

COMBINE_CHUNK = 16  # splits the combine merges at a time
# (tokens per tile, warps, pipeline stages) tried on a GPU with each centroid lookup (_lookup),
# the fastest kept per layout and shape: registers, shared memory and bytes in flight trade
# off differently per card.
TILE_CONFIGS = ((16, 4, 3), (32, 4, 2), (32, 8, 3), (64, 4, 1), (64, 8, 2), (16, 2, 3))
# numpy runs a few big tiles faster than many small ones
INTERPRETER_TILE = {"BLOCK_N": 64, "SELECT": False}
# A running max below every score: no inf - inf when a whole tile is hidden.
_SENTINEL: tl.constexpr = tl.constexpr(-1.0e30)
# int64 entries per row of _split's table (FROM_TABLE): kvbench.kernels.triton.rows.LINE
_LINE: tl.constexpr = tl.constexpr(24)


@triton.jit
def _lookup(tab, codes, BITS: tl.constexpr, SELECT: tl.constexpr):
    """The centroid of every code: a gather from the table, or (SELECT, up to 4 bits) a chain
    of selects between its entries held in registers. Which is faster depends on the card."""
    if SELECT and BITS <= 4:
        c = tl.zeros(codes.shape, dtype=tl.float32) + tl.load(tab).to(tl.float32)
        for i in tl.static_range(1, 1 << BITS):
            c = tl.where(codes == i, tl.load(tab + i).to(tl.float32), c)
        return c
    return tl.load(tab + codes).to(tl.float32)


@triton.jit
def _tile(kind: tl.constexpr, p0, p1, p2, tab, n_tokens, tokens, t0, t1, t2, scale,
          D: tl.constexpr, D_P2: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
          N_BYTES: tl.constexpr, N_GROUPS: tl.constexpr, BYTES_P2: tl.constexpr,
          SELECT: tl.constexpr, FOLD: tl.constexpr):
    """(BLOCK_N, D_P2) float32 keys or values of `tokens` (int64) of one sequence-head, whose
    tensors p0 p1 p2 start at its rows, t0 t1 t2 apart per token: raw, decoded (intq, lloydmax)
    or rotated-domain c * norm (turbo); zero where masked. Packed rows are read as whole bytes
    along each token's row and unpacked in registers. FOLD (codebook layouts with one norm per
    token): the centroids alone, _token_scale's factor left to the caller to apply once per
    token."""
    cols = tl.arange(0, D_P2)
    token_ok = tokens < n_tokens
    ok = token_ok[:, None] & (cols < D)[None, :]
    if kind == 0:  # RAW: p0 (T, D)
        return tl.load(p0 + tokens[:, None] * t0 + cols[None, :], mask=ok,
                       other=0.0).to(tl.float32)
    if kind == 1:  # INTQ along tokens: codes p0 (whole codes per byte), scale p1, min p2
        per: tl.constexpr = 8 // BITS
        byte_col = tl.arange(0, D_P2 // per)
        byte = tl.load(p0 + tokens[:, None] * t0 + byte_col[None, :],
                       mask=token_ok[:, None] & (byte_col < N_BYTES)[None, :], other=0)
        shift = (tl.arange(0, per) * BITS).to(tl.int32)
        code = (byte.to(tl.int32)[:, :, None] >> shift[None, None, :]) & ((1 << BITS) - 1)
        width: tl.constexpr = GROUP if GROUP < D_P2 else D_P2  # values per scale in the tile
        group = tl.arange(0, D_P2 // width)
        group_ok = token_ok[:, None] & (group < N_GROUPS)[None, :]
        s = tl.load(p1 + tokens[:, None] * t1 + group[None, :], mask=group_ok,
                    other=0.0).to(tl.float32)
        z = tl.load(p2 + tokens[:, None] * t2 + group[None, :], mask=group_ok,
                    other=0.0).to(tl.float32)
        q = tl.reshape(code, (code.shape[0], D_P2 // width, width)).to(tl.float32)
        x = tl.reshape(q * s[:, :, None] + z[:, :, None], (code.shape[0], D_P2))
        return tl.where(ok, x, 0.0)
    # Codebook layouts: rows of GROUP values (lloydmax: GROUP = D), N_BYTES bytes each, 8 codes
    # in every BITS bytes; one norm per row.
    eights = tl.arange(0, D_P2 // 8)
    block = eights * 8 // GROUP
    first_byte = (eights * 8 % GROUP) // 8 * BITS
    k = tl.arange(0, BYTES_P2)
    at = tokens[:, None, None] * t0 + (block * N_BYTES + first_byte)[None, :, None] + \
        k[None, None, :]
    byte_ok = (k[None, :] < BITS) & (first_byte[:, None] + k[None, :] < N_BYTES) & \
        (eights * 8 < D)[:, None]
    packed = tl.load(p0 + at, mask=token_ok[:, None, None] & byte_ok[None, :, :], other=0)
    c = _lookup(tab, unpack_groups(packed, BITS, BYTES_P2), BITS, SELECT)
    if FOLD:
        return tl.where(ok, c, 0.0)
    blocks: tl.constexpr = D_P2 // GROUP if GROUP < D_P2 else 1
    block_ids = tl.arange(0, blocks)
    norm = tl.load(p1 + tokens[:, None] * t1 + block_ids[None, :],
                   mask=token_ok[:, None] & (block_ids < N_GROUPS)[None, :], other=0.0)
    if kind == 2:  # LLOYDMAX: as LloydMaxCodec decodes
        c = tl.math.div_rn(c, scale)
    c = tl.reshape(c, (c.shape[0], blocks, D_P2 // blocks)) * norm.to(tl.float32)[:, :, None]
    return tl.where(ok, tl.reshape(c, (c.shape[0], D_P2)), 0.0)  # TURBO: rotated domain


@triton.jit
def _token_scale(kind: tl.constexpr, norm_ptr, n_tokens, tokens, stride, scale):
    """Per token, what FOLD left out of its centroids: norm / scale (lloydmax) or norm (turbo);
    applied to a score or a softmax weight instead of to every value."""
    norm = tl.load(norm_ptr + tokens * stride, mask=tokens < n_tokens, other=0.0)
    if kind == 2:
        return tl.math.div_rn(norm.to(tl.float32), scale)
    return norm.to(tl.float32)


@triton.jit
def _tanh(x):
    """tanh to a few ulp (the interpreter has no libdevice): (1 - e) / (1 + e), e = exp(-2|x|),
    and where that cancels (|x| < 0.3) its Taylor series to x^11."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    x2 = a * a
    series = a + a * x2 * (-0.33333334 + x2 * (0.13333334 + x2 * (-0.053968254 + x2 * (
        0.021869488 + x2 * -0.008863236))))
    t = tl.where(a < 0.3, series, (1.0 - e) / (1.0 + e))
    return tl.where(x < 0, -t, t)


@triton.jit
def _rotate_blocks(x, d1_ptr, d2_ptr, inverse: tl.constexpr, ROWS: tl.constexpr,
                   D_P2: tl.constexpr, BLK: tl.constexpr, LOG2_BLK: tl.constexpr, sqrt_blk):
    """Each BLK-wide block of the rows of x (ROWS, D_P2): R x (or R^T x, inverse)."""
    lanes = tl.arange(0, BLK)
    d1 = tl.load(d1_ptr + lanes)
    d2 = tl.load(d2_ptr + lanes)
    blocks = tl.reshape(x, (ROWS * (D_P2 // BLK), BLK))
    if inverse:
        blocks = fwht_rows(blocks * d2[None, :], BLK, LOG2_BLK, sqrt_blk) * d1[None, :]
    else:
        blocks = fwht_rows(blocks * d1[None, :], BLK, LOG2_BLK, sqrt_blk) * d2[None, :]
    return tl.reshape(blocks, (ROWS, D_P2))


@triton.jit
def _operand(x, ROUND_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """x rounded to ROUND_DTYPE (the query's), held as DOT_DTYPE for tl.dot: the same type,
    except in Triton's interpreter, whose dot multiplies bfloat16's raw bits: there bfloat16
    values are held as float32 (their products are exact in float32 all the same)."""
    return cast(cast(x, ROUND_DTYPE), DOT_DTYPE)


@triton.jit
def _row_tensor(line, at: tl.constexpr, typed, h):
    """(a row's tensor at head h, its token stride) from line[at:at + 3] (address, head and
    token strides); `typed`: a pointer of the tensor's element type."""
    base = tl.load(line + at).to(tl.pointer_type(typed.dtype.element_ty), bitcast=True)
    return base + h * tl.load(line + at + 1), tl.load(line + at + 2)


@triton.jit
def _split(q_ptr, k0, k1, k2, k_tab, k_d1, k_d2, v0, v1, v2, v_tab, v_d1, v_d2, bias_ptr,
           m_ptr, l_ptr, acc_ptr, table, n_tokens, first_token, tokens_per_split, first_split,
           n_splits_total, bias_offset, bias_len, kv_heads, q_heads, sm_scale, softcap,
           k_scale, v_scale, k0b, k0h, k0t, k1b, k1h, k1t, k2b, k2h, k2t,
           v0b, v0h, v0t, v1b, v1h, v1t, v2b, v2h, v2t, FROM_TABLE: tl.constexpr,
           D: tl.constexpr, D_P2: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr,
           BLOCK_N: tl.constexpr, SELECT: tl.constexpr, HAS_BIAS: tl.constexpr,
           SOFTCAP: tl.constexpr,
           K_KIND: tl.constexpr, K_BITS: tl.constexpr, K_GROUP: tl.constexpr,
           K_BYTES: tl.constexpr, K_GROUPS: tl.constexpr, K_LOG2: tl.constexpr,
           K_BYTES_P2: tl.constexpr, K_FOLD: tl.constexpr,
           V_KIND: tl.constexpr, V_BITS: tl.constexpr, V_GROUP: tl.constexpr,
           V_BYTES: tl.constexpr, V_GROUPS: tl.constexpr, V_LOG2: tl.constexpr,
           V_BYTES_P2: tl.constexpr, V_FOLD: tl.constexpr,
           ROUND_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """One (sequence, KV head, split)'s partial softmax (m, l, acc). FROM_TABLE (rows.py): b is a
    batched step's row, its tensors' places, token count and split plan its line of `table`
    (the tensor arguments give only the element types); a split past the row's own stores an
    empty partial (m the sentinel, l 0, acc 0) after the row's real ones."""
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b = bh // kv_heads
    h = bh % kv_heads
    cols = tl.arange(0, D_P2)
    col_ok = cols < D
    heads = tl.arange(0, GP)
    head_ok = heads < GROUP
    if FROM_TABLE:
        line = table + b * _LINE  # rows.py's line: its places, then 18-22 TOKENS..EMPTY
        k0, k0t = _row_tensor(line, 0, k0, h)
        k1, k1t = _row_tensor(line, 3, k1, h)
        k2, k2t = _row_tensor(line, 6, k2, h)
        v0, v0t = _row_tensor(line, 9, v0, h)
        v1, v1t = _row_tensor(line, 12, v1, h)
        v2, v2t = _row_tensor(line, 15, v2, h)
        n_tokens = tl.load(line + 18)
        tokens_per_split = tl.load(line + 19)
        at_split = split + tl.where(split < tl.load(line + 21), tl.load(line + 20),
                                    tl.load(line + 22))
    else:
        # each tensor at this sequence-head's rows (strides: batch b, head h, token t)
        k0 += b * k0b + h * k0h
        k1 += b * k1b + h * k1h
        k2 += b * k2b + h * k2h
        v0 += b * v0b + h * v0h
        v1 += b * v1b + h * v1h
        v2 += b * v2b + h * v2h
        at_split = first_split + split
    q_rows = b * q_heads + h * GROUP + heads
    q = tl.load(q_ptr + q_rows[:, None] * D + cols[None, :],
                mask=head_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    if K_KIND == 3:
        q = _rotate_blocks(q, k_d1, k_d2, False, GP, D_P2, K_GROUP, K_LOG2, k_scale)
    q = _operand(q, ROUND_DTYPE, DOT_DTYPE)
    m = tl.full((GP,), _SENTINEL, dtype=tl.float32)
    l = tl.zeros((GP,), dtype=tl.float32)
    acc = tl.zeros((GP, D_P2), dtype=tl.float32)
    start = first_token + split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, n_tokens)
    for first in range(start, stop, BLOCK_N):
        tokens = first + tl.arange(0, BLOCK_N).to(tl.int64)
        k = _tile(K_KIND, k0, k1, k2, k_tab, n_tokens, tokens, k0t, k1t, k2t, k_scale, D, D_P2,
                  K_BITS, K_GROUP, K_BYTES, K_GROUPS, K_BYTES_P2, SELECT, K_FOLD)
        k = _operand(k, ROUND_DTYPE, DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if K_FOLD:
            scores = scores * _token_scale(K_KIND, k1, n_tokens, tokens, k1t, k_scale)[None, :]
        scores = scores * sm_scale
        if SOFTCAP:
            scores = softcap * _tanh(scores / softcap)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + bh * bias_len + bias_offset + tokens,
                           mask=tokens < stop, other=0.0)
            scores += bias[None, :]
        scores = tl.where((tokens < stop)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = _tile(V_KIND, v0, v1, v2, v_tab, n_tokens, tokens, v0t, v1t, v2t, v_scale, D, D_P2,
                  V_BITS, V_GROUP, V_BYTES, V_GROUPS, V_BYTES_P2, SELECT, V_FOLD)
        weights = p
        if V_FOLD:
            weights = p * _token_scale(V_KIND, v1, n_tokens, tokens, v1t, v_scale)[None, :]
        acc = acc * alpha[:, None] + tl.dot(_operand(weights, ROUND_DTYPE, DOT_DTYPE),
                                            _operand(v, ROUND_DTYPE, DOT_DTYPE),
                                            input_precision=PRECISION)
        m = m_new
    if V_KIND == 3:
        acc = _rotate_blocks(acc, v_d1, v_d2, True, GP, D_P2, V_GROUP, V_LOG2, v_scale)
    at = bh * n_splits_total + at_split
    tl.store(m_ptr + at * GP + heads, m)
    tl.store(l_ptr + at * GP + heads, l)
    tl.store(acc_ptr + (at * GP + heads)[:, None] * D_P2 + cols[None, :], acc)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, sinks_ptr, out_ptr, n_splits, kv_heads, q_heads,
             D: tl.constexpr, D_P2: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr,
             CHUNK: tl.constexpr, HAS_SINKS: tl.constexpr):
    """One query head: the splits' partial softmaxes merged, CHUNK splits at a time, and its
    sink's logit (HAS_SINKS) in the denominator."""
    program = tl.program_id(0).to(tl.int64)
    bh = program // GROUP
    head = program % GROUP
    cols = tl.arange(0, D_P2)
    top = tl.full((1,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((1,), dtype=tl.float32)
    out = tl.zeros((1, D_P2), dtype=tl.float32)
    for first in range(0, n_splits, CHUNK):
        splits = first + tl.arange(0, CHUNK)
        split_ok = splits < n_splits
        at = (bh * n_splits + splits) * GP + head
        m = tl.load(m_ptr + at, mask=split_ok, other=float("-inf"))
        l = tl.load(l_ptr + at, mask=split_ok, other=0.0)
        acc = tl.load(acc_ptr + at[:, None] * D_P2 + cols[None, :], mask=split_ok[:, None],
                      other=0.0)
        new_top = tl.maximum(top, tl.max(m, axis=0))  # finite: every split has a finite m
        weight = tl.exp(m - new_top)
        shrink = tl.exp(top - new_top)
        total = total * shrink + tl.sum(weight * l, axis=0)
        out = out * shrink[:, None] + tl.sum(weight[:, None] * acc, axis=0)[None, :]
        top = new_top
    q_head = (bh % kv_heads) * GROUP + head
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + q_head)
        new_top = tl.maximum(top, sink)
        shrink = tl.exp(top - new_top)
        total = total * shrink + tl.exp(sink - new_top)
        out = out * shrink[:, None]
    out = out / total[:, None]
    row = (bh // kv_heads) * q_heads + q_head
    tl.store(out_ptr + row * D + cols[None, :], cast(out, out_ptr.dtype.element_ty),
             mask=(cols < D)[None, :])


def _tuned():
    """_split autotuned over TILE_CONFIGS once per layout and shape (on the first call)."""
    configs = [triton.Config({"BLOCK_N": n, "SELECT": select}, num_warps=w, num_stages=st)
               for n, w, st in TILE_CONFIGS for select in (False, True)]
    key = ["D", "GROUP", "K_KIND", "K_BITS", "K_GROUP", "V_KIND", "V_BITS", "V_GROUP",
           "DOT_DTYPE", "HAS_BIAS", "SOFTCAP"]  # not the token count: splits keep tiles alike
    return triton.autotune(configs=configs, key=key)(_split)


# The interpreter would time every configuration at its own pace: it runs one.
_SPLIT, _TILE = (_split, INTERPRETER_TILE) if interpreting() else (_tuned(), {})


def chosen_tile() -> str | None:
    """The tile configuration the GPU's autotuning last chose (None where it did not run)."""
    best = getattr(_SPLIT, "best_config", None)
    return None if best is None else str(best)




@functools.cache
def _no_table(device: torch.device) -> torch.Tensor:
    """A launch's table without rows: int64 as a table, so both share their autotuned tile."""
    return torch.zeros(_LINE.value, dtype=torch.int64, device=device)


def launch_split(grid: tuple[int, int], q: torch.Tensor, keys: tuple, values: tuple, bias,
                 out: tuple, table: torch.Tensor | None, ints: tuple, kv_heads: int,
                 scaling: float, softcap: float | None, consts: dict) -> None:
    """One _split launch. keys, values: side_args'; out: partials'; ints: (tokens, first token,
    tokens per split, first split, splits, bias offset, bias length); table: rows' or None."""
    (k_args, k_strides, k_const, k_scale), (v_args, v_strides, v_const, v_scale) = keys, values
    _SPLIT[grid](
        q, *k_args, *v_args, bias if bias is not None else q, *out,
        _no_table(q.device) if table is None else table, *ints, kv_heads, q.shape[1], scaling,
        float(softcap or 1.0), k_scale, v_scale, *k_strides, *v_strides,
        FROM_TABLE=table is not None, HAS_BIAS=bias is not None, SOFTCAP=bool(softcap),
        **{f"K_{k}": v for k, v in k_const.items()}, **{f"V_{k}": v for k, v in v_const.items()},
        **consts, **_TILE, **LAUNCH)


def merge(out: tuple, sinks: torch.Tensor | None, q: torch.Tensor, kv_heads: int,
          consts: dict) -> torch.Tensor:
    """The splits' partials (partials') merged by one _combine launch; q's shape and dtype."""
    m, l, acc = out
    result = torch.empty_like(q)
    _combine[(m.shape[0] * consts["GROUP"],)](
        m, l, acc, sinks if sinks is not None else m, result, m.shape[1], kv_heads, q.shape[1],
        D=consts["D"], D_P2=consts["D_P2"], GROUP=consts["GROUP"], GP=consts["GP"],
        CHUNK=COMBINE_CHUNK, HAS_SINKS=sinks is not None, **LAUNCH)
    return result
