"""Token-reduction methods (am, am_task, streamingllm, snapkv, h2o) inside a real model's
attention: what they keep, that AM's beta reaches the logits and helps on the fitted queries, that
decode after compaction continues the positions, and that bad budgets are refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure.divergence import kl_divergence
from kvbench.methods import build_method, implementation
from kvbench.models.attention import biased_attention
from kvbench.models.hf_cache import KVBenchCache
from tests.plugins.model_runs import cpu_context
from tests.plugins.tensors import token_ids

PREFILL, TOTAL = 48, 64


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama.model


def _ids(n=TOTAL, seed=3):
    return token_ids(n, seed)


def _forward(model, cache, ids):
    """The model on ids through `cache`: a KVBenchCache hands its reads to kvbench's attention
    (KVBenchCache.forward), a DynamicCache is passed as it is."""
    if isinstance(cache, KVBenchCache):
        return cache.forward(model, ids)
    return model(ids, past_key_values=cache, use_cache=True)


@torch.inference_mode()
def _run(model, method, ids=None, prefill=PREFILL, before_compaction=None):
    """Prefill, end_prefill, one-token decode; (decode logits (1, steps, vocab), cache).
    `method`: a method's settings, run as their torch implementation (None: a DynamicCache)."""
    ids = _ids() if ids is None else ids
    cache = (DynamicCache(config=model.config) if method is None
             else KVBenchCache(implementation(method), model.config.num_hidden_layers))
    _forward(model, cache, ids[:, :prefill])
    if before_compaction is not None:
        before_compaction(cache)
    if method is not None:
        cache.end_prefill()
    logits = [_forward(model, cache, ids[:, i:i + 1]).logits
              for i in range(prefill, ids.shape[1])]
    return torch.cat(logits, dim=1), cache


@torch.inference_mode()
def _full_keys(model, ids):
    """Every layer's keys (1, H, T, D) of one plain forward over ids."""
    cache = DynamicCache(config=model.config)
    model(ids, past_key_values=cache, use_cache=True)
    return [layer.keys for layer in cache.layers]


def _kl(plain, other):
    return float(kl_divergence(plain, other).mean())


# ---- Attention Matching -----------------------------------------------------------------------

def test_beta_changes_attention_inside_the_model_and_helps_on_the_fitted_queries(tiny):
    captured = {}

    def keep_queries(cache):
        captured["queries"] = cache.layers[0].policy.observed_queries()
        captured["keys"] = cache.layers[0].policy.keys.clone()
        captured["values"] = cache.layers[0].policy.values.clone()

    with_beta, cache = _run(tiny, build_method("am", {"ratio": 0.25}),
                            before_compaction=keep_queries)
    policy = cache.layers[0].policy
    assert policy.retained_tokens == 12 + TOTAL - PREFILL  # 12 compacted slots + decoded tokens
    assert policy.bias.shape == (1, tiny.config.num_key_value_heads, policy.retained_tokens)
    assert policy.bias[..., :12].abs().max() > 0.01
    assert (policy.bias[..., 12:] == 0).all()  # decoded tokens get no bias

    # Inside the model: the same compacted keys and values with beta zeroed give other logits.
    def zero_beta(cache):
        for layer in cache.layers:
            layer.policy.bias.zero_()

    zeroed = _zeroed_after_compaction(tiny, zero_beta)
    assert (with_beta - zeroed).abs().max() > 1e-3

    # On the queries beta was fitted to, the compacted attention with beta is closer to the
    # prompt's full attention than the same compacted keys and values without it.
    queries, keys, values = captured["queries"], captured["keys"], captured["values"]
    compact_k, compact_v = policy.keys[..., :12, :], policy.values[..., :12, :]
    beta = policy.bias[..., :12]
    # a zero per-query bias: every key visible to every query, as the fit assumes
    target, _ = biased_attention(queries, keys, values, None,
                                 torch.zeros(1, keys.shape[1], queries.shape[-2], PREFILL))
    seen_all = torch.zeros(1, keys.shape[1], queries.shape[-2], 12)
    fitted, _ = biased_attention(queries, compact_k, compact_v, None, seen_all + beta[..., None, :])
    unbiased, _ = biased_attention(queries, compact_k, compact_v, None, seen_all)
    error_with = (fitted - target).square().mean()
    error_without = (unbiased - target).square().mean()
    assert error_with < error_without


@torch.inference_mode()
def _zeroed_after_compaction(model, change):
    ids = _ids()
    cache = KVBenchCache(implementation(build_method("am", {"ratio": 0.25})),
                         model.config.num_hidden_layers)
    cache.forward(model, ids[:, :PREFILL])
    cache.end_prefill()
    change(cache)
    return torch.cat([cache.forward(model, ids[:, i:i + 1]).logits
                      for i in range(PREFILL, TOTAL)], dim=1)


def test_decode_after_compaction_continues_positions_from_the_prompt_length(tiny):
    ids = _ids()
    _, cache = _run(tiny, build_method("am", {"ratio": 0.25}))
    full = _full_keys(tiny, ids)
    policy = cache.layers[0].policy
    assert policy.seen_tokens == TOTAL
    # Layer 0's keys depend only on the token and its RoPE position: the decoded tokens' keys,
    # after the 12 compacted slots, are those of positions 48..63 in an uncompressed forward.
    torch.testing.assert_close(policy.keys[..., 12:, :], full[0][..., PREFILL:, :])
    shifted = _full_keys(tiny, ids[:, PREFILL - 12:])[0][..., 12:, :]  # positions 12..27
    assert (policy.keys[..., 12:, :] - shifted).abs().max() > 1e-3


def test_am_fits_beat_plain_top_t_selection_in_the_model(tiny):
    plain, _ = _run(tiny, None)
    fitted, _ = _run(tiny, build_method("am", {"ratio": 0.25}))
    top_t, _ = _run(tiny, build_method("am", {"ratio": 0.25, "fit_beta": False,
                                              "fit_values": False}))
    assert _kl(plain, fitted) < _kl(plain, top_t)


def test_am_task_uses_a_probe_as_its_reference_queries(tiny):
    ids = _ids()
    probe = _ids(8, seed=5)

    def feed_probe_then_take_it_back(cache):
        cache.forward(tiny, probe)
        cache.crop(-probe.shape[1])

    with_probe, cache = _run(tiny, build_method("am_task", {"ratio": 0.25}),
                             before_compaction=feed_probe_then_take_it_back)
    without, _ = _run(tiny, build_method("am_task", {"ratio": 0.25}))
    assert cache.layers[0].policy.seen_tokens == TOTAL  # the probe left no token behind
    assert (with_probe - without).abs().max() > 1e-3
    # one mask shared by all heads of a layer: every head kept the same positions
    full = _full_keys(tiny, ids)[0]
    kept = cache.layers[0].policy.keys[0, :, :12, :]
    positions = [[int((full[0, h] - k).abs().sum(-1).argmin()) for k in kept[h]]
                 for h in range(kept.shape[0])]
    assert all(p == positions[0] for p in positions)


def test_am_task_mad_threshold_keeps_the_outstanding_tokens(tiny):
    _, cache = _run(tiny, build_method("am_task", {"tau": 1.0}))
    kept = cache.retained_tokens()
    assert all(0 < k - (TOTAL - PREFILL) < PREFILL for k in kept)


# ---- eviction references ----------------------------------------------------------------------

def test_streamingllm_keeps_the_sinks_and_the_newest_tokens_through_decode(tiny):
    ids = _ids()
    _, cache = _run(tiny, build_method("streamingllm", {"budget": 12, "sinks": 4}))
    assert cache.retained_tokens() == [12] * len(cache.layers)
    # layer 0's keys depend only on token and position, so they can be compared with a full pass
    keys = _full_keys(tiny, ids)[0]
    expected = torch.cat([keys[..., :4, :], keys[..., TOTAL - 8:, :]], dim=-2)
    torch.testing.assert_close(cache.layers[0].policy.keys, expected)


def test_snapkv_keeps_its_window_and_the_budget(tiny):
    _, cache = _run(tiny, build_method("snapkv", {"budget": 20, "window": 8}))
    assert cache.retained_tokens() == [20 + TOTAL - PREFILL] * len(cache.layers)
    # the observation window and every decoded token are the newest 24 rows, unchanged
    keys = _full_keys(tiny, _ids())[0]
    torch.testing.assert_close(cache.layers[0].policy.keys[..., 12:, :], keys[..., PREFILL - 8:, :])


def test_h2o_holds_its_budget_and_recent_window_through_decode(tiny):
    _, cache = _run(tiny, build_method("h2o", {"budget": 16, "recent": 0.5}))
    assert cache.retained_tokens() == [16] * len(cache.layers)
    assert all(layer.policy.accumulated.shape[-1] == 16 for layer in cache.layers)
    keys = _full_keys(tiny, _ids())[0]
    torch.testing.assert_close(cache.layers[0].policy.keys[..., 8:, :], keys[..., TOTAL - 8:, :])


@pytest.mark.parametrize("name", ["streamingllm", "snapkv", "h2o", "am", "am_task"])
def test_every_token_method_moves_the_model_but_not_wildly(tiny, name):
    plain, _ = _run(tiny, None)
    params = {"ratio": 0.5, **({"window": 8} if name == "snapkv" else {})}
    reduced, cache = _run(tiny, build_method(name, params))
    assert 0 < _kl(plain, reduced) < 5
    assert cache.accounted_bytes() < _identity_bytes(tiny)


def _identity_bytes(model):
    _, cache = _run(model, build_method("identity"))
    return cache.accounted_bytes()


@pytest.mark.parametrize("params, message", [
    ({}, "exactly one of ratio"),
    ({"ratio": 0.5, "budget": 3}, "exactly one of ratio"),
    ({"ratio": 1.0}, r"ratio must be in \(0, 1\)"),
    ({"budget": 0}, "budget must be >= 1"),
])
def test_budgets_are_checked_on_construction(params, message):
    with pytest.raises(ValueError, match=message):
        build_method("snapkv", params)


def test_a_budget_that_keeps_everything_is_refused(tiny):
    with pytest.raises(ValueError, match="keeps every one of the 48 prompt tokens"):
        _run(tiny, build_method("h2o", {"budget": 48}))


@pytest.mark.parametrize("name, params, message", [
    ("am", {"ratio": 0.5, "score": "median"}, "score: Input should be 'rms', 'max' or 'mean'"),
    ("am", {"ratio": 0.5, "ridge": -1.0}, "ridge must be >= 0"),
    ("am", {"ratio": 0.5, "queries": "self"}, "queries: Input should be 'context' or 'repeat'"),
    ("snapkv", {"ratio": 0.5, "kernel": 4}, "odd"),
    ("h2o", {"ratio": 0.5, "recent": 1.0}, "recent"),
    ("streamingllm", {"ratio": 0.5, "sinks": -1}, "sinks"),
    ("am_task", {"task_tokens": 0}, "task_tokens"),
])
def test_bad_settings_are_refused(name, params, message):
    with pytest.raises(ValueError, match=message):
        build_method(name, params)


# ---- on MLX: the same policies as mlx-lm's cache ----------------------------------------------

@pytest.mark.parametrize("name, params", [
    ("am", {"ratio": 0.25}), ("am_task", {"ratio": 0.25}), ("streamingllm", {"budget": 12}),
    ("snapkv", {"budget": 20, "window": 8}), ("h2o", {"budget": 16}),
    ("butterfly", {"block_size": 8, "window": 6}),
])
def test_mlx_runs_the_same_reduction_with_the_bias_in_its_attention(tiny, name, params):
    mx = pytest.importorskip("mlx.core")
    from kvbench.models.mlx_host import MLXKVBenchCache
    from kvbench.models.mlx_loading import load_mlx_model

    loaded = load_mlx_model("tiny:llama")
    ids = _ids()[0].tolist()
    expected, torch_cache = _run(tiny, build_method(name, params))
    cache = MLXKVBenchCache(implementation(build_method(name, params), "mlx"), loaded.num_layers)
    loaded.model(mx.array([ids[:PREFILL]]), cache=cache.layers)
    cache.end_prefill()
    steps = [loaded.model(mx.array([ids[i:i + 1]]), cache=cache.layers)[0, -1]
             for i in range(PREFILL, TOTAL)]
    got = torch.from_numpy(np.array(mx.stack(steps)))
    assert cache.retained_tokens() == torch_cache.retained_tokens()
    assert cache.accounted_bytes() == torch_cache.accounted_bytes()
    torch.testing.assert_close(got, expected[0], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("kept", [0, 10])
def test_a_reduction_that_keeps_nothing_or_everything_raises(kept):
    from kvbench.methods.torch.token_cache import TokenCache

    cache = TokenCache()
    cache.append(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4))
    with pytest.raises(RuntimeError, match=f"kept {kept} of 10 tokens"):
        cache.keep(torch.arange(kept).expand(1, 2, -1))


def test_a_wrapper_passes_queries_and_bias_through_to_the_policy_it_wraps(tiny):
    method = build_method("sparse_v", {"base": "am", "base_params": {"ratio": 0.25},
                                       "tau": 1e-30})
    wrapped, cache = _run(tiny, method)
    bare, _ = _run(tiny, build_method("am", {"ratio": 0.25}))
    assert cache.retained_tokens() == [12 + TOTAL - PREFILL] * len(cache.layers)
    assert cache.counters()["sparse_v_steps"] == (TOTAL - PREFILL) * len(cache.layers)
    torch.testing.assert_close(wrapped, bare, atol=1e-4, rtol=1e-4)


def test_causal_am_fits_the_prompt_queries_only_against_earlier_keys(tiny):
    plain, _ = _run(tiny, None)
    causal, cache = _run(tiny, build_method("am", {"ratio": 0.25, "causal": True}))
    spec, _ = _run(tiny, build_method("am", {"ratio": 0.25}))
    assert cache.retained_tokens() == [12 + TOTAL - PREFILL] * len(cache.layers)
    assert (causal - spec).abs().max() > 1e-3
    assert 0 < _kl(plain, causal) < 5


def test_repeat_prefill_queries_come_from_the_prompt_fed_again_and_taken_back(tiny):
    method = build_method("am", {"ratio": 0.25, "queries": "repeat"})
    assert method.reference_probe([5, 6, 7]) == [5, 6, 7]
    assert build_method("am", {"ratio": 0.25}).reference_probe([5, 6, 7]) == []

    def repeat_prompt(cache):
        cache.forward(tiny, _ids()[:, :PREFILL])
        cache.crop(-PREFILL)

    repeated, cache = _run(tiny, method, before_compaction=repeat_prompt)
    context, _ = _run(tiny, build_method("am", {"ratio": 0.25}))
    assert cache.layers[0].policy.seen_tokens == TOTAL  # the repeat left no token behind
    assert (repeated - context).abs().max() > 1e-3
    with pytest.raises(RuntimeError, match="needs its reference probe"):
        _run(tiny, method)


def test_benchmarks_feed_the_reference_probe():
    from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams

    ctx = cpu_context("tiny:llama")
    params = PerplexityParams(context=48, continuation=16)
    perplexity = measurement(Perplexity)
    repeat = perplexity.run(
        params, implementation(build_method("am", {"ratio": 0.25, "queries": "repeat"})),
        ctx).metrics
    context = perplexity.run(params, implementation(build_method("am", {"ratio": 0.25})),
                             ctx).metrics
    assert repeat["perplexity"].value != context["perplexity"].value
    assert repeat["retained_kv"].value == context["retained_kv"].value


def test_snapkv_keeps_what_the_official_code_keeps():
    """FasterDecoding/SnapKV's update_kv, restated (one query head per KV head, where its per
    query head choice and kvbench's per KV head one agree): the window's queries attend
    causally, their weights summed over the window on the prefix are average-pooled (kernel 5,
    zero padded), and the top budget - window prefix tokens are kept with the window."""
    from kvbench.methods.settings.eviction import SnapKV

    heads, prompt, dim, window, kernel, budget = 2, 80, 16, 32, 5, 48
    g = torch.Generator().manual_seed(7)
    keys = torch.randn(1, heads, prompt, dim, generator=g)
    queries = torch.randn(1, heads, prompt, dim, generator=g) * 2
    method = SnapKV(budget=budget)
    assert (method.window, method.kernel, method.pooling) == (window, kernel, "avg")
    cache = implementation(method).new_layer_cache(0)
    cache.append(keys, keys.clone())
    cache.observe_queries(queries)
    cache.end_prefill()

    logits = queries[..., -window:, :] @ keys.transpose(2, 3) / dim ** 0.5
    causal = torch.full((window, window), float("-inf")).triu(1)
    logits[..., -window:] += causal
    votes = logits.softmax(-1)[..., : prompt - window].sum(dim=-2)
    pooled = torch.nn.functional.avg_pool1d(votes, kernel, padding=kernel // 2, stride=1)
    top = pooled.topk(budget - window, dim=-1).indices.sort(dim=-1).values
    want = torch.cat([keys[..., : prompt - window, :].gather(
        2, top[0].unsqueeze(0).unsqueeze(-1).expand(-1, -1, -1, dim)), keys[..., -window:, :]], 2)
    assert torch.equal(cache.attention_inputs()[0], want)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, total", [(300, 300), (77, 500), (1, 90)])
def test_the_attention_keys_receive_is_the_same_in_blocks_of_queries(causal, n, total):
    """h2o's and snapkv's scores over blocks of queries (a working set of one block, not
    queries x keys): the unblocked sum bit for bit where it fits in one block, else the same
    within float32 rounding of a sum over queries taken in another order (measured here:
    <= 4e-7 of the largest score)."""
    from kvbench.methods.torch.token_cache import attention_received, attention_weights

    g = torch.Generator().manual_seed(n + total)
    queries = torch.randn(1, 6, n, 16, generator=g) * 3
    keys = torch.randn(1, 2, total, 16, generator=g) * 3
    whole = attention_weights(queries, keys, 0.25, causal=causal).sum(dim=(1, 2))
    one_row = 2 * 3 * total * 4  # bytes of one query's weights over every head
    assert torch.equal(attention_received(queries, keys, 0.25, causal, block_bytes=n * one_row),
                       whole)
    # by default a block's weights take at most a quarter of the keys in float32, or 16 MiB:
    # every query here
    assert torch.equal(attention_received(queries, keys, 0.25, causal), whole)
    for rows in (1, 7, 64):
        blocked = attention_received(queries, keys, 0.25, causal, block_bytes=rows * one_row)
        assert (blocked - whole).abs().max() <= 1e-6 * whole.abs().max()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, total", [(37, 37), (1, 90), (5, 64)])
def test_attention_weights_are_the_masked_softmax_bit_for_bit(causal, n, total):
    """The scorers' weights (computed in place for speed) equal softmax(q k^T * scaling) with
    each query's later keys masked, each query head reading its group's KV head."""
    from kvbench.methods.torch.token_cache import attention_weights

    g = torch.Generator().manual_seed(n + total)
    queries = torch.randn(1, 6, n, 16, generator=g) * 3
    keys = torch.randn(1, 2, total, 16, generator=g) * 3
    scaling = 16 ** -0.5
    logits = queries.reshape(2, 3, n, 16) @ keys[0].unsqueeze(1).transpose(-1, -2) * scaling
    if causal:
        later = torch.arange(total) > torch.arange(total - n, total).unsqueeze(1)
        logits = logits.masked_fill(later, float("-inf"))
    weights = attention_weights(queries, keys, scaling, causal=causal)
    assert weights.shape == (2, 3, n, total)
    if n > 1:
        assert torch.equal(weights, logits.softmax(-1))
    else:  # one query: a group's 3 rows are one matrix product, not 3 matrix-vector ones
        reference = logits.softmax(-1)
        assert ((weights - reference).abs() <= 1e-5 * reference.amax(-1, keepdim=True)).all()
    if causal and n > 1:
        assert weights[0, 0, 0, total - n + 1:].eq(0).all()  # the first query sees no later key


@torch.inference_mode()
def test_am_holds_at_most_max_queries_per_kv_head_as_the_prompt_comes(tiny):
    """A prompt announced longer than max_queries allow keeps the queries of every s-th token
    only, as its forwards come; unannounced, it keeps them all and takes the same tokens' at
    the fit: the same reference queries, at their positions. All queries fit differently."""
    ids = _ids()[:, :PREFILL]
    method = implementation(build_method("am", {"ratio": 0.25, "causal": True,
                                                "max_queries": 24}))
    streamed = KVBenchCache(method, tiny.config.num_hidden_layers)
    streamed.begin_prompt(PREFILL)
    for start in range(0, PREFILL, 16):
        _forward(tiny, streamed, ids[:, start : start + 16])
    whole = KVBenchCache(method, tiny.config.num_hidden_layers)
    _forward(tiny, whole, ids)
    policy, other = streamed.policies[0], whole.policies[0]
    groups = tiny.config.num_attention_heads // tiny.config.num_key_value_heads
    stride = -(-groups * PREFILL // 24)
    assert stride > 1 and sum(q.shape[-2] for q in policy.observed) == -(-PREFILL // stride)
    assert sum(q.shape[-2] for q in other.observed) == PREFILL
    (queries, at), (all_queries, all_at) = policy.reference_queries(), other.reference_queries()
    assert torch.equal(at, torch.arange(0, PREFILL, stride)) and torch.equal(at, all_at)
    torch.testing.assert_close(queries, all_queries, rtol=1e-5, atol=1e-5)
    bounded, _ = _run(tiny, build_method("am", {"ratio": 0.25, "causal": True,
                                                "max_queries": 24}))
    every, _ = _run(tiny, build_method("am", {"ratio": 0.25, "causal": True}))
    assert (bounded - every).abs().max() > 1e-4


@torch.inference_mode()
def test_am_task_lets_go_of_the_queries_it_will_not_read(tiny):
    """am_task reads the prompt's last task_tokens queries (or a probe fed in one step): fed in
    forwards, it holds those of the newest forward and task_tokens more, the same last ones."""
    ids = _ids()[:, :PREFILL]
    method = implementation(build_method("am_task", {"ratio": 0.25, "task_tokens": 8}))
    chunked = KVBenchCache(method, tiny.config.num_hidden_layers)
    for start in range(0, PREFILL, 16):
        _forward(tiny, chunked, ids[:, start : start + 16])
        assert sum(q.shape[-2] for q in chunked.policies[0].observed) <= 8 + 16
    whole = KVBenchCache(method, tiny.config.num_hidden_layers)
    _forward(tiny, whole, ids)
    (queries, _), (last, _) = (cache.policies[0].reference_queries() for cache in (chunked, whole))
    assert queries.shape[-2] == 8
    torch.testing.assert_close(queries, last, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="cannot take back 40"):
        chunked.policies[0].trim(40)
