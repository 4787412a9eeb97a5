"""Compressed Butterfly (`butterfly`): partner rules, visibility, a float64 dense reference for
prefill and decode, and the byte accounting."""
import math

import pytest
import torch

from kvbench.methods import METHODS, implementation
from kvbench.methods.settings.butterfly import Butterfly
from kvbench.methods.torch.butterfly import (
    PARTNER_RULES,
    block_visible,
    partner,
    stages,
    visible_summaries,
)
from kvbench.models.attention import biased_attention
from tests.plugins.model_runs import stepped_logits
from tests.plugins.tensors import token_ids

B, W, T, D, HKV, HQ = 8, 6, 70, 16, 2, 4


# -- partner rules and visibility -------------------------------------------------------------

def test_stages_is_ceil_log2_at_least_one():
    assert [stages(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 1, 2, 2, 3, 3, 4, 4, 5]


def test_causal_shift_uses_the_stage_of_the_layer():
    # 9 blocks -> 4 stages: layer l shifts by 2^(l mod 4)
    assert [partner("causal_shift", 8, layer, 9) for layer in range(6)] == [7, 6, 4, 0, 7, 6]
    # 3 blocks -> 2 stages
    assert [partner("causal_shift", 2, layer, 3) for layer in range(4)] == [1, 0, 1, 0]
    # 2 blocks -> 1 stage: always b - 1
    assert [partner("causal_shift", 1, layer, 2) for layer in range(3)] == [0, 0, 0]
    # a shift past block 0 is no partner
    assert partner("causal_shift", 1, 1, 8) is None
    assert partner("causal_shift", 0, 0, 1) is None


def test_other_rules():
    # xor: 5 = 0b101 with 3 stages: 5^1 = 4, 5^2 = 7 (later: none), 5^4 = 1
    assert [partner("xor", 5, layer, 8) for layer in range(3)] == [4, None, 1]
    assert partner("fixed_stride", 5, 3, 8) == 4
    assert partner("fixed_stride", 0, 3, 8) is None
    assert all(partner("local_only", b, layer, 16) is None
               for b in range(16) for layer in range(4))
    with pytest.raises(ValueError, match="causal_shift"):
        partner("causal_shfit", 3, 0, 4)


def test_random_partner_is_deterministic_and_earlier():
    draws = {(seed, layer, b): partner("random", b, layer, b + 1, seed)
             for seed in (0, 1) for layer in range(3) for b in range(1, 40)}
    assert all(0 <= p < b for (_, _, b), p in draws.items())
    # the same call twice gives the same block
    assert all(partner("random", b, layer, b + 1, seed) == p
               for (seed, layer, b), p in draws.items())
    # the seed and the layer both change the draws
    assert any(draws[0, 0, b] != draws[1, 0, b] for b in range(1, 40))
    assert any(draws[0, 0, b] != draws[0, 1, b] for b in range(1, 40))
    assert partner("random", 0, 0, 1, 0) is None


def test_visibility_boundary():
    # block 0 ends at token 7; with W = 6 a query at q sees it iff 7 <= q - 5
    assert block_visible(0, 12, B, W)
    assert not block_visible(0, 11, B, W)
    assert visible_summaries("causal_shift", 12, B, W, 0) == [0]
    assert visible_summaries("causal_shift", 11, B, W, 0) == []
    # block 2 (tokens 16..23) for a query in block 3 under fixed_stride: q - 5 >= 23 -> q >= 28
    assert visible_summaries("fixed_stride", 28, B, W, 0) == [0, 2]
    assert visible_summaries("fixed_stride", 27, B, W, 0) == [0]
    # partner 0 is the sink, once; local_only sees no summary at all
    assert visible_summaries("fixed_stride", 11, B, W, 0) == []
    assert visible_summaries("fixed_stride", 12, B, W, 0) == [0]
    assert visible_summaries("fixed_stride", 15, B, W, 0) == [0]
    assert visible_summaries("local_only", 60, B, W, 0) == []


# -- float64 dense reference -------------------------------------------------------------------

def reference_blocks(rule: str, q: int, layer: int, seed: int) -> list[int]:
    """The visible summaries, written out from the spec (random reuses partner(): its draw is
    the implementation's, checked above)."""
    if rule == "local_only":
        return []
    b = q // B
    n = b + 1
    stage = layer % max(1, math.ceil(math.log2(n))) if n > 1 else 0
    if rule == "causal_shift":
        p = b - 2 ** stage
    elif rule == "xor":
        p = b ^ (2 ** stage)
        p = p if p < b else -1
    elif rule == "fixed_stride":
        p = b - 1
    else:
        p = partner("random", b, layer, n, seed)
        p = -1 if p is None else p
    return sorted({x for x in (0, p) if x >= 0 and (x + 1) * B - 1 <= q - W + 1})


def reference(K, V, Q, rule, layer, seed):
    """(1, HQ, T, D) float64: one softmax per query over its window and its visible block means."""
    K, V, Q = K[0].double(), V[0].double(), Q[0].double()
    groups = Q.shape[0] // K.shape[0]
    out = torch.empty_like(Q)
    for q in range(T):
        blocks = reference_blocks(rule, q, layer, seed)
        lo = max(0, q - W + 1)
        keys = [K[:, p * B:(p + 1) * B].mean(1, keepdim=True) for p in blocks] + [K[:, lo:q + 1]]
        vals = [V[:, p * B:(p + 1) * B].mean(1, keepdim=True) for p in blocks] + [V[:, lo:q + 1]]
        k = torch.cat(keys, 1).repeat_interleave(groups, 0)
        v = torch.cat(vals, 1).repeat_interleave(groups, 0)
        logits = torch.einsum("hd,hkd->hk", Q[:, q], k) * D ** -0.5
        out[:, q] = torch.einsum("hk,hkd->hd", logits.softmax(-1), v)
    return out.unsqueeze(0)


def expected_bytes(cache, element_size: int) -> int:
    f32_rows = cache.summary_slots + (1 if cache.seen_tokens % cache.method.block_size else 0)
    return 2 * HKV * D * (cache.retained_tokens * element_size + 4 * f32_rows)


SCHEDULES = {
    "prefill_then_decode": [37] + [1] * (T - 37),
    "chunks": [13, 5, 1, 11, 16, 2, 1, 21],
    "decode_only": [1] * T,
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("layer", [0, 1, 3])
@pytest.mark.parametrize("rule", PARTNER_RULES)
def test_matches_dense_reference(rule, layer, schedule):
    steps = SCHEDULES[schedule]
    assert sum(steps) == T
    gen = torch.Generator().manual_seed(1000 + 7 * layer + PARTNER_RULES.index(rule))
    K, V, Q = (torch.randn(1, h, T, D, generator=gen, dtype=torch.float64).float()
               for h in (HKV, HKV, HQ))
    ref = reference(K, V, Q, rule, layer, seed=3)
    method = Butterfly(block_size=B, window=W, partner_rule=rule, seed=3)
    cache = implementation(method).new_layer_cache(layer)
    pos = 0
    for i, n in enumerate(steps):
        cache.append(K[..., pos:pos + n, :], V[..., pos:pos + n, :])
        pos += n
        keys, values, bias = cache.attention_inputs()
        S, R = cache.summary_slots, cache.retained_tokens
        assert cache.seen_tokens == pos
        assert S == pos // B  # one summary per completed block, for every rule
        assert keys.shape == values.shape == (1, HKV, S + R, D)
        assert bias.shape == (1, HKV, n, S + R) and bias.dtype == torch.float32
        assert R <= W - 1 + n  # only what this step's queries need
        out, _ = biased_attention(Q[..., pos - n:pos, :], keys, values, None, bias, D ** -0.5)
        torch.testing.assert_close(out.double(), ref[..., pos - n:pos, :], atol=1e-5, rtol=0)
        if n == 1:
            assert R <= W
        if schedule == "prefill_then_decode" and i == 0:
            cache.end_prefill()
            assert cache.retained_tokens == W
        assert cache.retained_bytes == expected_bytes(cache, 4)
        raw_tail = 2 * HKV * D * 4 * cache.retained_tokens
        assert raw_tail <= cache.measured_bytes() <= 2 * cache.retained_bytes
    assert pos == T


# -- bytes ---------------------------------------------------------------------------------

def decode(method, tokens, dtype=torch.float16, layer=2):
    """`method`: Butterfly settings, run as their torch implementation."""
    gen = torch.Generator().manual_seed(5)
    cache = implementation(method).new_layer_cache(layer)
    for _ in range(tokens):
        k, v = (torch.randn(1, HKV, 1, D, generator=gen).to(dtype) for _ in range(2))
        cache.append(k, v)
    return cache


@pytest.mark.parametrize("rule", PARTNER_RULES)
def test_bytes_grow_as_tokens_over_block(rule):
    method = Butterfly(block_size=B, window=W, partner_rule=rule)
    short, long = decode(method, 10 * B), decode(method, 40 * B)
    for cache, blocks in ((short, 10), (long, 40)):
        assert cache.retained_tokens == W
        assert cache.summary_slots == blocks
        assert cache.retained_bytes == expected_bytes(cache, 2)
        assert cache.measured_bytes() == cache.retained_bytes
    raw = 2 * HKV * D * 2 * W
    assert (long.retained_bytes - raw) == 4 * (short.retained_bytes - raw)
    # an open block adds its float32 running sums
    partial = decode(method, 10 * B + 3)
    assert partial.summary_slots == 10
    assert partial.retained_bytes == short.retained_bytes + 2 * HKV * D * 4
    assert partial.measured_bytes() == partial.retained_bytes


def test_model_dtype_is_kept_and_summaries_stay_float32():
    cache = decode(Butterfly(block_size=B, window=W), 3 * B + 2, dtype=torch.bfloat16)
    keys, values, _ = cache.attention_inputs()
    assert keys.dtype == values.dtype == torch.bfloat16
    assert cache.summary_k.dtype == cache.open_k.dtype == torch.float32
    assert cache.retained_bytes == expected_bytes(cache, 2)


def test_long_prefill_holds_raw_tokens_until_the_next_append():
    cache = implementation(Butterfly(block_size=B, window=W)).new_layer_cache(0)
    k = torch.randn(1, HKV, 50, D)
    cache.append(k, k)
    assert cache.retained_tokens == 50 and cache.summary_slots == 6
    cache.append(k[..., :1, :], k[..., :1, :])  # trims to W - 1 old + 1 new
    assert cache.retained_tokens == W
    torch.testing.assert_close(cache.raw_k[..., :W - 1, :], k[..., 50 - (W - 1):, :])


# -- configuration ---------------------------------------------------------------------------

@pytest.mark.parametrize("params, field", [
    ({"block_size": 0}, "block_size"),
    ({"block_size": True}, "block_size"),
    ({"window": 0}, "window"),
    ({"window": 2.5}, "window"),
    ({"partner_rule": "butterfly"}, "partner_rule"),
    ({"seed": "a"}, "seed"),
])
def test_bad_config_names_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        Butterfly(**params)


def test_unknown_rule_suggests_the_nearest():
    with pytest.raises(ValueError, match="Did you mean 'causal_shift'"):
        Butterfly(partner_rule="causal_shfit")


def test_registered_with_layout():
    assert METHODS.get("butterfly") is Butterfly
    assert implementation(Butterfly()).layout() == (
        "raw window of 64 tokens + one float32 K/V mean per 128-token block"
        " (sink + partner by causal_shift); K and V both counted")
    assert "local_only" in implementation(Butterfly(partner_rule="local_only")).layout()


# -- inside a model ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama.model


def _model_logits(model, method, ids, prefill):
    """Logits of every position: a prefill of `prefill` tokens, then one-token steps."""
    logits, cache = stepped_logits(model, method, ids, prefill)
    return torch.cat(logits, dim=1), cache


def test_in_the_model_a_window_over_everything_is_plain_attention(tiny):
    ids = token_ids(60, seed=4)
    plain, _ = _model_logits(tiny, None, ids, 30)
    wide, _ = _model_logits(tiny, Butterfly(block_size=8, window=1000), ids, 30)
    torch.testing.assert_close(wide, plain, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rule", ["causal_shift", "local_only", "random"])
def test_in_the_model_block_sparse_prefill_equals_decoding_token_by_token(tiny, rule):
    ids = token_ids(90, seed=4)
    method = Butterfly(block_size=8, window=6, partner_rule=rule)
    one_pass, cache = _model_logits(tiny, method, ids, 90)
    stepped, _ = _model_logits(tiny, method, ids, 37)
    torch.testing.assert_close(stepped, one_pass, atol=1e-4, rtol=1e-4)
    plain, _ = _model_logits(tiny, None, ids, 90)
    assert (one_pass - plain).abs().max() > 1e-2  # the sparsity is real
    assert cache.retained_tokens() == [6] * len(cache.layers)
    assert cache.measured_bytes() == cache.accounted_bytes()
