import math

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.methods import METHODS, implementation
from kvbench.methods.core.kivi_cache import KiviCache
from kvbench.methods.settings.identity import Identity
from kvbench.methods.settings.kivi import Kivi
from tests.plugins.model_runs import cpu_context, stepped_logits
from tests.plugins.tensors import randn


def _raw_after(tokens, method):
    """(raw keys, raw values) the rule leaves once `tokens` tokens have been attended
    (`method`: Kivi settings)."""
    chunk = method.residual or method.group_size
    return tokens % chunk, min(tokens, method.residual)


def _group_bound(rows, group, bits):
    """Per element of `rows` (..., L): half its group's fp16 step plus the fp16 rounding of min."""
    groups = -(-rows.shape[-1] // group)
    parts = [rows[..., i * group : (i + 1) * group] for i in range(groups)]
    lo = torch.stack([p.amin(-1) for p in parts], -1)
    hi = torch.stack([p.amax(-1) for p in parts], -1)
    scale = ((hi - lo) / (2**bits - 1)).half().float()
    bound = scale / 2 + (lo - lo.half().float()).abs()
    return bound.repeat_interleave(group, dim=-1)[..., : rows.shape[-1]]


def test_registered_by_name_and_has_no_single_codec():
    assert METHODS.get("kivi") is Kivi
    settings = Kivi()
    assert (settings.bits, settings.group_size, settings.residual) == (2, 32, 128)
    method = implementation(settings)
    assert method.codec() is None
    assert method.key_codec().format.axis == "channel" and method.value_codec().format.axis == "token"


@pytest.mark.parametrize("residual, group", [(8, 4), (12, 4), (0, 4)])
def test_raw_tokens_follow_the_rule_one_token_at_a_time(residual, group):
    method = Kivi(bits=2, group_size=group, residual=residual)
    cache = implementation(method).new_layer_cache(0)
    assert isinstance(cache, KiviCache)
    keys, values = randn(1, 2, 40, 8, seed=1), randn(1, 2, 40, 8, seed=2)
    for t in range(1, 41):
        cache.append(keys[..., t - 1 : t, :], values[..., t - 1 : t, :])
        # The step's own token is attended raw; what came before is quantized by the rule.
        raw_k, raw_v = _raw_after(t - 1, method)
        assert (cache.keys.raw_tokens, cache.values.raw_tokens) == (raw_k + 1, raw_v + 1), t
        assert cache.seen_tokens == cache.retained_tokens == t
        k_out, v_out, bias = cache.attention_inputs()
        assert bias is None and k_out.shape == v_out.shape == (1, 2, t, 8)
        assert torch.equal(k_out[..., t - raw_k - 1 :, :], keys[..., t - raw_k - 1 : t, :])
        assert torch.equal(v_out[..., t - raw_v - 1 :, :], values[..., t - raw_v - 1 : t, :])
        if t - raw_k - 1 > 0:
            assert not torch.equal(k_out[..., : t - raw_k - 1, :], keys[..., : t - raw_k - 1, :])
        if t - raw_v - 1 > 0:
            assert not torch.equal(v_out[..., : t - raw_v - 1, :], values[..., : t - raw_v - 1, :])
    # Packed chunks are merged: decode reads one block each for keys and values.
    assert len(cache.keys.packed) == len(cache.values.packed) == 1


@pytest.mark.parametrize("tokens", [1, 3, 4, 7, 8, 9, 15, 16, 17, 24, 25, 33])
@pytest.mark.parametrize("residual", [8, 0])
def test_raw_tokens_follow_the_rule_after_a_prefill(tokens, residual):
    method = Kivi(bits=4, group_size=4, residual=residual)
    cache = implementation(method).new_layer_cache(0)
    keys, values = randn(1, 2, tokens, 8, seed=3), randn(1, 2, tokens, 8, seed=4)
    cache.append(keys, values)
    assert (cache.keys.raw_tokens, cache.values.raw_tokens) == (tokens, tokens)
    cache.end_prefill()
    raw_k, raw_v = _raw_after(tokens, method)
    assert (cache.keys.raw_tokens, cache.values.raw_tokens) == (raw_k, raw_v)
    assert cache.keys.packed_tokens == tokens - raw_k
    assert cache.values.packed_tokens == tokens - raw_v
    assert cache.retained_tokens == tokens
    k_out, v_out, _ = cache.attention_inputs()
    assert torch.equal(k_out[..., tokens - raw_k :, :], keys[..., tokens - raw_k :, :])
    assert torch.equal(v_out[..., tokens - raw_v :, :], values[..., tokens - raw_v :, :])


@pytest.mark.parametrize("bits", [2, 4])
def test_quantized_part_is_within_half_a_step(bits):
    # head_dim 20 with groups of 8 channels: values have a trailing partial group of 4.
    method = Kivi(bits=bits, group_size=8, residual=16)
    cache = implementation(method).new_layer_cache(0)
    keys, values = randn(1, 2, 50, 20, seed=5) * 3 + 1, randn(1, 2, 50, 20, seed=6) * 2
    cache.append(keys, values)
    cache.end_prefill()
    k_out, v_out, _ = cache.attention_inputs()
    # Keys: 3 chunks of 16 tokens quantized, per channel over groups of 8 tokens; 2 raw.
    k_rows, k_hat = keys[..., :48, :].transpose(-1, -2), k_out[..., :48, :].transpose(-1, -2)
    k_err = (k_hat - k_rows).abs()
    assert (k_err <= _group_bound(k_rows, 8, bits) + 1e-5).all() and k_err.max() > 0
    # Values: the 34 tokens older than the newest 16 quantized, per token over groups of 8.
    v_err = (v_out[..., :34, :] - values[..., :34, :]).abs()
    assert (v_err <= _group_bound(values[..., :34, :], 8, bits) + 1e-5).all() and v_err.max() > 0
    assert torch.equal(k_out[..., 48:, :], keys[..., 48:, :])
    assert torch.equal(v_out[..., 34:, :], values[..., 34:, :])


@pytest.mark.parametrize("bits", [2, 4])
def test_retained_bytes_is_packed_plus_raw(bits):
    group, residual, dim, heads = 4, 8, 12, 2
    method = Kivi(bits=bits, group_size=group, residual=residual)
    cache = implementation(method).new_layer_cache(0)
    keys = randn(1, heads, 37, dim, seed=7).half()
    values = randn(1, heads, 37, dim, seed=8).half()
    cache.append(keys[..., :20, :], values[..., :20, :])
    cache.end_prefill()
    for t in range(20, 37):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
    cache.end_prefill()  # quantize what the last step left, so the state is the rule's
    raw_k, raw_v = _raw_after(37, method)
    packed_k, packed_v = 37 - raw_k, 37 - raw_v
    # Keys: per channel, `bits` per token and an fp16 scale and min per group of tokens.
    key_bytes = heads * dim * (packed_k * bits // 8 + 4 * packed_k // group)
    # Values: per token, packed channels and an fp16 scale and min per group of channels.
    value_bytes = heads * packed_v * (math.ceil(dim * bits / 8) + 4 * math.ceil(dim / group))
    raw_bytes = heads * (raw_k + raw_v) * dim * 2  # float16
    assert cache.retained_bytes == key_bytes + value_bytes + raw_bytes
    assert cache.measured_bytes() == cache.retained_bytes


@pytest.mark.parametrize("bits, group, expected", [(2, 32, 3.0), (4, 32, 5.0), (2, 64, 2.5)])
def test_bits_per_quantized_value(bits, group, expected):
    method = implementation(Kivi(bits=bits, group_size=group, residual=0))
    x = randn(1, 2, 128, 64, seed=9)
    for codec in (method.key_codec(), method.value_codec()):
        assert 8 * codec.nbytes(codec.encode(x)) / x.numel() == expected
    cache = method.new_layer_cache(0)
    cache.append(x, x)
    cache.end_prefill()  # residual 0 and 128 tokens: everything quantized
    assert cache.keys.raw_tokens == cache.values.raw_tokens == 0
    assert 8 * cache.retained_bytes / (2 * x.numel()) == expected


@pytest.mark.parametrize("prefill", [5, 20])
def test_tiny_model_is_exact_until_something_is_quantized(tiny_llama, prefill):
    tokens = tiny_llama.tokenizer.encode("KIVI keeps the newest tokens in full precision.")[:30]
    ids = torch.tensor([tokens])
    method = Kivi(bits=2, group_size=4, residual=8)
    kivi, _ = stepped_logits(tiny_llama.model, method, ids, prefill)
    identity, _ = stepped_logits(tiny_llama.model, Identity(), ids, prefill)
    # The prefill attends to itself unquantized, as upstream KIVI does.
    assert torch.equal(kivi[0], identity[0])
    for step, t in enumerate(range(prefill + 1, len(tokens) + 1), start=1):
        # Attending with t tokens reads the t - 1 earlier ones as the rule left them: exact while
        # t - 1 < residual (no key chunk and no value older than the residual yet).
        if t - 1 < method.residual:
            assert torch.equal(kivi[step], identity[step]), t
        else:
            assert not torch.allclose(kivi[step], identity[step], atol=1e-4), t


def test_perplexity_on_tiny_model_compresses_well_beyond_the_residual():
    ctx = cpu_context("tiny:llama")
    params = PerplexityParams(context=1024, continuation=16)
    out = measurement(Perplexity).run(params, implementation(Kivi()), ctx).metrics
    # 1039 tokens fed; the last step attends raw to its token on top of the rule at 1038:
    # keys 1024 quantized + 15 raw, values 910 quantized + 129 raw, 2 layers x 2 heads of 16.
    key_bytes = 16 * 1024 * 3 // 8  # 2 bits + 32 bits per group of 32 tokens
    value_bytes = 910 * (16 * 2 // 8 + 4)  # one partial group of 16 channels per token
    raw_bytes = (15 + 129) * 16 * 4  # float32
    expected = 2 * 2 * (key_bytes + value_bytes + raw_bytes)
    assert out["kv_bytes"].value == expected
    assert out["kv_bytes_measured"].value == expected
    assert out["compression_ratio"].value == pytest.approx(2 * 2 * 2 * 16 * 2 * 1039 / expected)
    assert out["compression_ratio"].value > 1
    assert out["ppl_rel_delta"].value != 0


@pytest.mark.parametrize(
    "field, params",
    [("bits", {"bits": 3}), ("bits", {"bits": 8}), ("group_size", {"group_size": 0}),
     ("residual", {"group_size": 32, "residual": 48}), ("residual", {"residual": -32})],
)
def test_invalid_config_names_the_field(field, params):
    with pytest.raises(ValueError, match=f"^{field} must"):
        Kivi(**params)
