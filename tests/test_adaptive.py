"""`adaptive`: per-(layer, KV head) bits from attention entropy over a method with `bits`."""
import math

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.methods import METHODS, build_method, implementation
from kvbench.methods.core.adaptive_cache import AdaptiveCache
from kvbench.methods.settings.adaptive import Adaptive
from kvbench.models.session import CalibrationStats, TorchSession
from tests.plugins.model_runs import cpu_context
from tests.plugins.tensors import randn

TEXT = "Adaptive bits: peaked heads keep more of them, diffuse heads fewer. " * 6


def _calibrate(method, loaded, tokens):
    """As a benchmark calibrates: the session measures, the method takes the statistics."""
    TorchSession(loaded, torch.device("cpu")).calibrate(method, tokens)


@pytest.fixture(scope="module")
def calibrated(tiny_llama):
    method = implementation(Adaptive(base="lloydmax", base_bits=3, scale=1.0))
    tokens = tiny_llama.tokenizer.encode(TEXT)[:300]  # more rows than one chunk
    _calibrate(method, tiny_llama, tokens)
    return method


def _eager_entropy(loaded, tokens):
    """Per (layer, query head): mean over rows of the entropy (bits) of output_attentions."""
    model = loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            attentions = model(torch.tensor([tokens]), output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)
    weights = [a[0].double() for a in attentions]
    rows = [-(p * torch.log2(p.clamp_min(1e-300))).sum(-1) for p in weights]
    return torch.stack([r.mean(-1) for r in rows])


@pytest.mark.usefixtures("torch_caches_join")  # measured bytes: held exactly
def test_registered_and_uncalibrated_is_the_base_at_base_bits():
    assert METHODS.get("adaptive") is Adaptive
    settings = Adaptive(base="intq", base_params={"group_size": 8}, base_bits=4)
    method = implementation(settings)
    assert settings.widths() == [2, 4, 8] and method.head_bits is None
    base = implementation(build_method("intq", {"group_size": 8, "bits": 4}))
    assert method.codec().layout() == base.codec().layout()
    assert "not calibrated" in method.layout()
    cache, reference = method.new_layer_cache(0), base.new_layer_cache(0)
    assert isinstance(cache, AdaptiveCache)
    keys, values = randn(1, 3, 20, 16, seed=1), randn(1, 3, 20, 16, seed=2)
    for c in (cache, reference):
        c.append(keys[..., :12, :], values[..., :12, :])
        c.append(keys[..., 12:, :], values[..., 12:, :])
    assert cache.head_bits == [4, 4, 4] and len(cache.groups) == 1
    got, want = cache.attention_inputs(), reference.attention_inputs()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(got[0], keys)  # it did quantize
    assert cache.retained_bytes == reference.retained_bytes == cache.measured_bytes()
    assert cache.seen_tokens == cache.retained_tokens == 20
    assert cache.counters() == {"kv_heads_4bit": 3.0}


def test_calibration_follows_entropy(tiny_llama, calibrated):
    tokens = tiny_llama.tokenizer.encode(TEXT)[:300]
    assert len(tokens) == 300
    # The entropy it measured is the eager attention's, query heads averaged per GQA group.
    query = _eager_entropy(tiny_llama, tokens)
    per_kv = query.view(tiny_llama.num_layers, tiny_llama.num_kv_heads, -1).mean(-1)
    torch.testing.assert_close(calibrated.entropy, per_kv)
    # ... and the model is back on its own attention, computing what it computed before.
    assert tiny_llama.model.config._attn_implementation == "kvbench"
    bits = torch.tensor(calibrated.head_bits)
    assert bits.shape == (tiny_llama.num_layers, tiny_llama.num_kv_heads)
    assert bits.unique().numel() > 1
    # The lowest-entropy head gets the most bits, the highest the fewest; the order is monotone.
    entropy = calibrated.entropy.flatten()
    flat = bits.flatten()
    order = entropy.argsort()
    assert flat[order[0]] == flat.max() and flat[order[-1]] == flat.min()
    assert all(flat[a] >= flat[b] for a, b in zip(order[:-1], order[1:]))
    assert "mean" in calibrated.layout() and "per layer" in calibrated.layout()


def test_calibration_is_deterministic_and_leaves_the_model_as_it_was(tiny_llama):
    ids = torch.tensor([tiny_llama.tokenizer.encode(TEXT)[:40]])
    with torch.inference_mode():
        before = tiny_llama.model(ids).logits
    tokens = tiny_llama.tokenizer.encode(TEXT)[:64]
    a = implementation(Adaptive(base="turbo", scale=1.0))
    b = implementation(Adaptive(base="turbo", scale=1.0))
    _calibrate(a, tiny_llama, tokens)
    _calibrate(b, tiny_llama, tokens)
    assert a.head_bits == b.head_bits and torch.equal(a.entropy, b.entropy)
    with torch.inference_mode():
        after = tiny_llama.model(ids).logits
    assert torch.equal(before, after)


@pytest.mark.usefixtures("torch_caches_join")  # measured bytes: held exactly
def test_bytes_and_values_per_head_are_each_heads_codec(tiny_llama, calibrated):
    assert any(len(set(row)) > 1 for row in calibrated.head_bits)  # heads split across widths
    for layer in range(tiny_llama.num_layers):
        cache = calibrated.new_layer_cache(layer)
        keys, values = randn(1, 2, 30, 16, seed=3 + layer), randn(1, 2, 30, 16, seed=5 + layer)
        cache.append(keys[..., :25, :], values[..., :25, :])
        cache.append(keys[..., 25:, :], values[..., 25:, :])
        k_out, v_out, bias = cache.attention_inputs()
        assert bias is None and k_out.shape == keys.shape
        total = 0
        per_width: dict[int, int] = {}
        for head, bits in enumerate(calibrated.head_bits[layer]):
            codec = implementation(build_method("lloydmax", {"bits": bits})).codec()
            pk = codec.encode(keys[:, head : head + 1])
            pv = codec.encode(values[:, head : head + 1])
            head_bytes = codec.nbytes(pk) + codec.nbytes(pv)
            # lloydmax: a float32 norm and ceil(bits * 16 / 8) code bytes per vector
            assert head_bytes == 2 * 30 * (4 + math.ceil(bits * 16 / 8))
            per_width[bits] = per_width.get(bits, 0) + head_bytes
            total += head_bytes
            assert torch.equal(k_out[:, head : head + 1], codec.decode(pk))
            assert torch.equal(v_out[:, head : head + 1], codec.decode(pv))
        assert cache.retained_bytes == total == cache.measured_bytes()
        assert cache.group_bytes() == per_width


def _allocate(settings, entropy):
    """The widths the implementation of Adaptive `settings` allocates for `entropy`."""
    return implementation(settings).allocate(entropy)


def test_allocation_rule_snaps_to_the_widths_the_base_accepts():
    entropy = torch.tensor([[1.0, 3.0]])  # sensitivity -1, -3: z = +1, -1
    assert _allocate(Adaptive(base="lloydmax", base_bits=3, scale=1.0), entropy) == [[4, 2]]
    # intq takes 2, 4, 8: 5 -> 4; 3 is a tie between 2 and 4, which goes toward base_bits 4.
    assert _allocate(Adaptive(base="intq", base_bits=4, scale=1.0), entropy) == [[4, 4]]
    # 6 ties between 4 and 8 (-> 4, toward base); 2 is a width.
    assert _allocate(Adaptive(base="intq", base_bits=4, scale=2.0), entropy) == [[4, 2]]
    # Clipped to 1..8 before snapping; equal entropies (std 0) keep base_bits.
    assert _allocate(Adaptive(base="lloydmax", base_bits=3, scale=10.0), entropy) == [[8, 1]]
    assert _allocate(Adaptive(base="lloydmax", base_bits=3, scale=1.0),
                     torch.full((2, 3), 2.5)) == [[3, 3, 3], [3, 3, 3]]


def test_fewer_than_16_calibration_tokens_is_refused(tiny_llama):
    method = implementation(Adaptive())
    with pytest.raises(ValueError, match="at least 16 tokens, got 15"):
        _calibrate(method, tiny_llama, list(range(10, 25)))
    assert method.head_bits is None


def test_calibration_takes_statistics_never_a_model(tiny_llama):
    """The method sets its widths from the entropy table it is handed; given a model it refuses
    instead of running one."""
    method = implementation(Adaptive(base="lloydmax", base_bits=3, scale=1.0))
    with pytest.raises(TypeError, match="attention entropy a benchmark measures"):
        method.calibrate(tiny_llama, list(range(10, 40)))
    entropy = torch.tensor([[1.0, 3.0], [1.0, 1.0]], dtype=torch.float64)  # (layers, query heads)
    stats = CalibrationStats(list(range(10, 40)), num_kv_heads=1,
                             measure_attention_entropy=lambda tokens: entropy)
    method.calibrate(stats, stats.tokens)
    # one KV head per layer: its query heads' mean; z = -1 and +1 around base_bits 3
    torch.testing.assert_close(method.entropy, torch.tensor([[2.0], [1.0]], dtype=torch.float64))
    assert method.head_bits == [[2], [4]]


def test_perplexity_calibrates_and_reports_heads_per_width():
    ctx = cpu_context("tiny:llama")
    method = implementation(Adaptive(base="lloydmax", base_bits=3, scale=1.0))
    params = PerplexityParams(context=48, continuation=16, calibration=64)
    perplexity = measurement(Perplexity)
    out = perplexity.run(params, method, ctx)
    assert method.head_bits is not None
    widths = [b for row in method.head_bits for b in row]
    reported = {k: v for k, v in out.info.items() if k.startswith("kv_heads_")}
    assert reported == {f"kv_heads_{b}bit": float(widths.count(b)) for b in set(widths)}
    assert f"mean {sum(widths) / len(widths):.3f} bits over 4 heads" in out.info["layout"]
    tokens = 48 + 15  # prefilled and decoded; lloydmax, head_dim 16, float32 nothing raw
    expected = sum(2 * tokens * (4 + math.ceil(b * 16 / 8)) for b in widths)
    assert out.metrics["kv_bytes"].value == expected
    with pytest.raises(ValueError, match="at least 16 tokens"):
        perplexity.run(PerplexityParams(context=48, continuation=16, calibration=8),
                       implementation(Adaptive()), ctx)


@pytest.mark.parametrize(
    "field, params",
    [("base", {"base": "identity"}), ("base", {"base": "no_such_method"}),
     ("base_bits", {"base_bits": 5}), ("base_bits", {"base": "intq", "base_bits": 3}),
     ("base_bits", {"base_bits": 9}), ("base_params", {"base_params": {"bits": 3}}),
     ("base_params", {"base_params": {"nope": 1}}), ("scale", {"scale": -0.5}),
     ("scale", {"scale": float("nan")})],
)
def test_invalid_config_names_the_field(field, params):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        Adaptive(**params)
