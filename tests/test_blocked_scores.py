"""Scores and fits from observed queries over blocks of queries (issue 67): each step holds one
block's (H, rows, T) logits, not queries x keys. Blocked results are checked against the
unblocked ones (one block) on fresh random inputs, with a block small enough that every case
takes several; the tolerances say how far the order of a sum over queries may move them."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kvbench.methods import implementation
from kvbench.methods.settings import build_method
from kvbench.methods.torch import am_fit, token_cache
from kvbench.methods.torch.token_cache import (SCORE_BLOCK_BYTES, SCORE_BLOCK_MAX,
                                                query_block_rows, score_block_bytes, top_k)

GiB = 2**30


# ---- the block size ---------------------------------------------------------------------------

def test_the_block_is_256_mib_off_cuda():
    assert SCORE_BLOCK_BYTES == 256 * 2**20
    assert score_block_bytes("cpu") == score_block_bytes(torch.device("cpu")) == SCORE_BLOCK_BYTES
    assert score_block_bytes("mps") == SCORE_BLOCK_BYTES


@pytest.mark.parametrize("free, block", [
    (1 * GiB, SCORE_BLOCK_BYTES),  # an eighth would be 128 MiB: the floor
    (16 * GiB, 2 * GiB),           # an eighth
    (80 * GiB, 4 * GiB),           # an eighth would be 10 GiB: the ceiling
])
def test_on_cuda_the_block_is_an_eighth_of_the_free_memory_within_bounds(monkeypatch, free,
                                                                         block):
    asked = []

    def mem_get_info(device):
        asked.append(device)
        return free, 80 * GiB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert score_block_bytes("cuda:1") == block
    assert asked == [torch.device("cuda:1")]
    assert SCORE_BLOCK_BYTES <= block <= SCORE_BLOCK_MAX == 4 * GiB


def test_rows_per_block_ask_the_device_only_when_the_queries_exceed_the_floor(monkeypatch):
    def no_gpu(device):
        raise AssertionError("the device was asked")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_gpu)
    row = 2**20
    assert query_block_rows(256, row, "cuda") == 256  # 256 MiB: one block, no question
    assert query_block_rows(10, row, "cuda", block_bytes=3 * row + 5) == 3
    assert query_block_rows(10, row, "cuda", block_bytes=1) == 1
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (16 * GiB, 80 * GiB))
    assert query_block_rows(10**6, row, "cuda") == 2048  # 2 GiB of 1 MiB rows
    assert query_block_rows(10**6, row, "cpu") == 256
    # a quarter of the scored keys at most: snapkv's 32-query window at 32k on an 8B's shape
    # (a query's weights 4 MiB, a layer's keys 128 MiB in float32) takes 8 queries a block
    assert query_block_rows(32, 4 * row, "cpu", keys_bytes=128 * row) == 8
    assert query_block_rows(10**6, row, "cuda", keys_bytes=GiB) == 256
    # ... or 16 MiB where that is more: a 2k prompt of the bundled model (3 KV heads of 64,
    # 3 query heads each) scores 227 queries a block, not 5
    row = 3 * 3 * 2048 * 4
    assert query_block_rows(2048, row, "cpu", keys_bytes=3 * 2048 * 64 * 4) == 16 * 2**20 // row


# ---- the weights themselves ------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads, kv_heads, n, total", [(32, 8, 40, 300), (9, 3, 17, 64),
                                                       (4, 4, 5, 9)])
def test_weights_of_a_group_read_its_key_head_once_and_equal_the_broadcast_product(
        causal, heads, kv_heads, n, total):
    """One product per KV head over its group's query rows: broadcasting (H, groups, n, D) @
    (H, 1, D, T) copied each key head once per query head (4x the layer's keys at 8B's shape,
    a whole plain cache at 32k on a 2-layer checkpoint). The same bits on this CPU for several
    queries (one query: tests/test_token_methods.py bounds the matrix-vector rounding)."""
    g = torch.Generator().manual_seed(heads * total)
    queries = torch.randn(1, heads, n, 16, generator=g)
    keys = torch.randn(1, kv_heads, total, 16, generator=g)
    q = queries.reshape(kv_heads, -1, n, 16)
    logits = (q @ keys[0].unsqueeze(1).transpose(-1, -2)) * 0.25
    if causal:
        positions = torch.arange(total)
        logits = logits.masked_fill(positions[total - n:].unsqueeze(1) < positions, -math.inf)
    assert torch.equal(token_cache.attention_weights(queries, keys, 0.25, causal),
                       logits.softmax(-1))


# ---- am's math: key_scores, fit_beta, fit_values ----------------------------------------------

def _qkv(seed, heads=3, n=150, total=64, dim=8):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(heads, n, dim, generator=g), 2 * torch.randn(heads, total, dim,
            generator=g), torch.randn(heads, total, dim, generator=g))


@pytest.fixture
def logits_rows(monkeypatch):
    """The query rows of every logits array am_fit forms."""
    seen = []
    original = am_fit._logits

    def recording(queries, keys, *args, **kwargs):
        seen.append(queries.shape[-2])
        return original(queries, keys, *args, **kwargs)

    monkeypatch.setattr(am_fit, "_logits", recording)
    return seen


@pytest.mark.parametrize("how", ["rms", "max", "mean"])
@pytest.mark.parametrize("causal", [False, True])
def test_key_scores_in_blocks(how, causal, logits_rows):
    """One block: the masked softmax's reduction itself, bit for bit. In blocks of 1, 7 and 40
    queries: 'max' is the same reduction of the same rows; 'rms' and 'mean' sum in another
    order: within 2e-6 of the largest score (seen: 7e-7, from the logits' matmul rounding
    differently at another count of rows)."""
    q, k, _ = _qkv(1)
    heads, n, total = q.shape[0], q.shape[1], k.shape[1]
    positions = torch.arange(n) % total if causal else None
    scaling = 8 ** -0.5
    logits = q @ k.transpose(-1, -2) * scaling
    if causal:
        logits = logits.masked_fill(torch.arange(total) > positions[:, None], -math.inf)
    attn = logits.softmax(-1)
    want = {"rms": lambda: attn.square().mean(-2).sqrt(), "max": lambda: attn.amax(-2),
            "mean": lambda: attn.mean(-2)}[how]()
    whole = am_fit.key_scores(q, k, scaling, how, positions)
    assert torch.equal(whole, want) and logits_rows == [n]
    for rows in (1, 7, 40):
        logits_rows.clear()
        blocked = am_fit.key_scores(q, k, scaling, how, positions,
                                    block_bytes=rows * heads * total * 4)
        assert max(logits_rows) == rows and sum(logits_rows) == n
        assert (blocked - whole).abs().max() <= 2e-6 * whole.abs().max()


@pytest.mark.parametrize("seed, n, total", [(2, 150, 64), (3, 97, 40), (4, 300, 33)])
@pytest.mark.parametrize("causal", [False, True])
def test_beta_and_values_fitted_in_blocks(seed, n, total, causal, logits_rows):
    """More queries than kept keys (am's case: groups x prompt queries): blocks of 1, 5 and 33
    queries fit beta and the values from the R factor of the stacked rows, the same solution
    as the whole system's up to rounding: beta within 1e-5 (seen: equal in float32 on these
    and 40 more draws), values within 1e-6 of their largest (seen: 2e-8)."""
    q, k, v = _qkv(seed, n=n, total=total)
    heads, scaling, t = q.shape[0], 8 ** -0.5, total // 4
    positions = torch.arange(n) % total if causal else None
    selected = top_k(am_fit.key_scores(q, k, scaling, positions=positions), t)
    beta = am_fit.fit_beta(q, k, selected, scaling, positions=positions)
    fitted = {ridge: am_fit.fit_values(q, k, v, selected, beta, scaling, ridge, positions)
              for ridge in (0.0, 1e-3)}
    for rows in (1, 5, 33):
        block = rows * heads * total * 8
        logits_rows.clear()
        blocked = am_fit.fit_beta(q, k, selected, scaling, positions=positions,
                                  block_bytes=block)
        assert max(logits_rows) == rows and sum(logits_rows) == n
        torch.testing.assert_close(blocked, beta, rtol=0, atol=1e-5)
        for ridge, whole in fitted.items():
            logits_rows.clear()
            got = am_fit.fit_values(q, k, v, selected, beta, scaling, ridge, positions,
                                    block_bytes=block)
            assert max(logits_rows) == rows and sum(logits_rows) == 2 * n  # Y's and X's
            assert (got - whole).abs().max() <= 1e-6 * whole.abs().max(), ridge


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("causal", [False, True])
def test_fewer_queries_than_kept_keys_fit_as_well_in_blocks(seed, causal):
    """am_task's case (a few task queries, many kept keys): B is not unique where the mass can
    be matched exactly, and blocks may land on another B at a tie of rounding (causal here:
    kept keys that no query sees have a free B; seen: beta 3 apart on them, both residuals
    1e-31); so the blocked B must match the mass as well as the whole one's, within 1e-6 of
    the largest mass per head (beta is float32), and the values fit within 1e-6 of their
    largest."""
    q, k, v = _qkv(seed, n=7, total=60)
    heads, scaling = q.shape[0], 8 ** -0.5
    positions = torch.arange(7) if causal else None
    selected = top_k(am_fit.key_scores(q, k, scaling, positions=positions), 15)
    block = 2 * heads * 60 * 8
    logits = q.double() @ k.double().transpose(-1, -2) * scaling
    if causal:
        logits = logits.masked_fill(torch.arange(60) > positions[:, None], -math.inf)
    e = (logits - logits.amax(-1, keepdim=True)).exp()
    mass, kept = e.sum(-1), e.gather(2, selected[:, None].expand(-1, 7, -1))

    def miss(beta):
        return ((kept @ beta.double().exp()[..., None]).squeeze(-1) - mass).norm(dim=-1)

    beta = am_fit.fit_beta(q, k, selected, scaling, positions=positions)
    blocked = am_fit.fit_beta(q, k, selected, scaling, positions=positions, block_bytes=block)
    assert (miss(blocked) <= miss(beta) + 1e-6 * mass.max()).all()
    whole = am_fit.fit_values(q, k, v, selected, beta, scaling, positions=positions)
    got = am_fit.fit_values(q, k, v, selected, beta, scaling, positions=positions,
                            block_bytes=block)
    assert (got - whole).abs().max() <= 1e-6 * whole.abs().max()


# ---- the policies: the same tokens kept, the block size from the device's default -------------

POLICIES = [("am", {"ratio": 0.25}), ("am", {"ratio": 0.25, "causal": True, "ridge": 1e-3}),
            ("am_task", {"budget": 20, "task_tokens": 24}), ("h2o", {"budget": 24}),
            ("snapkv", {"budget": 24, "window": 16})]


def _prompt(seed=7, heads=4, kv_heads=2, total=96, dim=16):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(1, heads, total, dim, generator=g),
            2 * torch.randn(1, kv_heads, total, dim, generator=g),
            torch.randn(1, kv_heads, total, dim, generator=g))


def _reduce(cache, queries, keys, values, chunk=32):
    """The prompt fed in chunks (h2o observes each), then end_prefill."""
    for start in range(0, keys.shape[-2], chunk):
        stop = start + chunk
        cache.append(keys[..., start:stop, :], values[..., start:stop, :])
        cache.observe_queries(queries[..., start:stop, :])
    cache.end_prefill()
    return [a if a is None or isinstance(a, torch.Tensor) else torch.from_numpy(np.array(a))
            for a in cache.attention_inputs()]


def _tiny_blocks(monkeypatch):
    """Every scorer's default block: 512 bytes (a query row or two), so all of them block."""
    monkeypatch.setattr(token_cache, "SCORE_BLOCK_BYTES", 512)


def _same(blocked, whole, name):
    for got, want in zip(blocked, whole):
        if want is None:
            assert got is None
        else:  # the kept keys are gathered as they were: equal tokens, equal keys
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), name


@pytest.mark.parametrize("name, params", POLICIES)
def test_policies_keep_the_same_tokens_in_blocks(monkeypatch, name, params):
    queries, keys, values = _prompt()
    method = build_method(name, params)
    whole = _reduce(implementation(method).new_layer_cache(0), queries, keys, values)
    _tiny_blocks(monkeypatch)
    blocked = _reduce(implementation(method).new_layer_cache(0), queries, keys, values)
    assert torch.equal(blocked[0], whole[0])  # the same keys kept
    _same(blocked, whole, name)


@pytest.mark.parametrize("name, params", POLICIES)
def test_mlx_policies_score_in_blocks_as_the_torch_reference(monkeypatch, name, params):
    """On MLX the scorers are the torch reference's own (token_policies bridges the arrays), so
    their blocks are the torch blocks: one block, the torch policy's result bit for bit; in
    blocks, the same kept tokens and fits within 1e-5 of the largest."""
    pytest.importorskip("mlx.core", reason="mlx is not installed")
    from kvbench.backends.mlx_arrays import to_mx

    queries, keys, values = _prompt(seed=11)
    method = build_method(name, params)
    torch_whole = _reduce(implementation(method).new_layer_cache(0), queries, keys, values)
    as_mx = [to_mx(a) for a in (queries, keys, values)]
    mlx_whole = _reduce(implementation(method, "mlx").new_layer_cache(0), *as_mx)
    for got, want in zip(mlx_whole, torch_whole):
        assert (got is None) == (want is None)
        if want is not None:
            assert torch.equal(got, want)
    _tiny_blocks(monkeypatch)
    mlx_blocked = _reduce(implementation(method, "mlx").new_layer_cache(0), *as_mx)
    assert torch.equal(mlx_blocked[0], mlx_whole[0])
    _same(mlx_blocked, mlx_whole, name)
