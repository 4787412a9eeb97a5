"""`decay`: temporal decay over a method with a `bits` field (requantized, then evicted)."""
import math

import pytest
import torch
from transformers import DynamicCache

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.methods import METHODS, implementation
from kvbench.methods.core.decay_cache import DecayCache
from kvbench.methods.settings.decay import Decay
from tests.plugins.model_runs import cpu_context, stepped_logits
from tests.plugins.tensors import randn

HEADS, DIM = 2, 8
# lloydmax accepts every width: the schedule picks among 2, 3, 4.
PARAMS = dict(base="lloydmax", base_bits=4, min_bits=2, decay_rate=4.0, window=3, segment=4)


def _score(age, seen, rate):
    return 1.0 if seen <= 1 else math.exp(-rate * age / (seen - 1))


def _width(score):
    """The rule for PARAMS, written out: min_bits below 0.3, else 2 + 2 * score to the nearest of
    2, 3, 4 with a tie going up."""
    if score < 0.3:
        return 2
    target = 2 + 2 * score
    return min((4, 3, 2), key=lambda b: abs(b - target))  # min keeps the first: ties go up


def _expected(seen, p=PARAMS):
    """(segments kept as [(start, bits)], tokens evicted, raw tokens) after `seen` one-token
    appends: segments of p['segment'] tokens form from token 0 once they lie beyond the window."""
    seg, rate = p["segment"], p["decay_rate"]
    formed = max(0, (seen - p["window"]) // seg)
    kept, evicted = [], 0
    for j in range(formed):
        score = _score(seen - 1 - (j * seg + seg - 1), seen, rate)
        if score < 0.1:
            evicted += seg
        else:
            kept.append((j * seg, _width(score)))
    return kept, evicted, seen - formed * seg


def _lloydmax_bytes(tokens, bits):
    """K and V of `tokens` tokens: a float32 norm and ceil(bits * DIM / 8) code bytes per vector."""
    return 2 * HEADS * tokens * (4 + math.ceil(bits * DIM / 8))


def test_registered_with_upstream_defaults():
    assert METHODS.get("decay") is Decay
    method = Decay()
    assert (method.base, method.base_bits, method.min_bits) == ("turbo", 3, 2)
    assert method.decay_rate == 1.0
    assert (method.min_below, method.evict_below) == (0.3, 0.1)
    assert method.widths() == [2, 3]
    assert Decay(base="intq", base_bits=8, min_bits=2).widths() == [2, 4, 8]
    # Width rule: nearest accepted width to 2 + 2 * score, a tie going to the wider one.
    intq = Decay(base="intq", base_bits=4, min_bits=2)
    assert [intq.bits_for(s) for s in (1.0, 0.51, 0.5, 0.49, 0.31, 0.29)] == [4, 4, 4, 2, 2, 2]
    assert intq.score(0, 100) == 1.0 and intq.score(99, 100) == pytest.approx(math.exp(-1))
    layout = implementation(method).layout()
    assert "newest 128 tokens" in layout and "K and V both counted" in layout


def test_one_token_appends_follow_the_score_rule_exactly():
    method = Decay(**PARAMS)
    cache = implementation(method).new_layer_cache(0)
    assert isinstance(cache, DecayCache)
    total = 120
    keys, values = randn(1, HEADS, total, DIM, seed=1), randn(1, HEADS, total, DIM, seed=2)
    requantized, widths = 0, {}
    for t in range(1, total + 1):
        cache.append(keys[..., t - 1 : t, :], values[..., t - 1 : t, :])
        kept, evicted, raw = _expected(t)
        # Independent tally of re-encodings: a kept segment whose width fell since the last step.
        for start, bits in kept:
            if start in widths and bits < widths[start]:
                requantized += PARAMS["segment"]
            widths[start] = bits
        assert [(s.start, s.bits) for s in cache.segments] == kept, t
        assert cache.raw_tokens == raw and raw >= min(t, PARAMS["window"])
        assert cache.seen_tokens == t
        assert cache.retained_tokens == len(kept) * PARAMS["segment"] + raw
        assert cache.counters() == {"tokens_evicted": evicted, "tokens_requantized": requantized}
        k_out, v_out, bias = cache.attention_inputs()
        assert bias is None and k_out.shape == (1, HEADS, cache.retained_tokens, DIM)
        # The window (and the tokens awaiting a segment) are bit-exact.
        assert torch.equal(k_out[..., -raw:, :], keys[..., t - raw : t, :])
        assert torch.equal(v_out[..., -raw:, :], values[..., t - raw : t, :])
        # The kept segments are the right tokens, in order: each decodes near its originals.
        for i, (start, bits) in enumerate(kept):
            got = k_out[..., i * 4 : i * 4 + 4, :]
            want = keys[..., start : start + 4, :]
            assert ((got - want).norm() / want.norm()) < 0.5, (t, start, bits)
    # The run covered every branch: evictions, each width, requantizations.
    kept, evicted, _ = _expected(total)
    assert evicted > 0 and {b for _, b in kept} == {2, 3, 4} and requantized > 0


def test_requantized_segments_hold_fewer_bytes():
    method = implementation(Decay(**PARAMS))
    cache = method.new_layer_cache(0)
    keys, values = randn(1, HEADS, 100, DIM, seed=3), randn(1, HEADS, 100, DIM, seed=4)
    history = []  # (bits, bytes, decoded keys) of the segment of tokens 40..43, at each width
    for t in range(100):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
        seg = next((s for s in cache.segments if s.start == 40), None)
        if seg is not None and (not history or history[-1][0] != seg.bits):
            codec_k, codec_v = method.codecs(seg.bits)
            nbytes = codec_k.nbytes(seg.keys) + codec_v.nbytes(seg.values)
            history.append((seg.bits, nbytes, codec_k.decode(seg.keys)))
    # Formed young at base_bits (score 0.77 at 47 tokens), then taken down one width at a time.
    assert [h[0] for h in history] == [4, 3, 2]
    assert history[0][1] > history[1][1] > history[2][1]
    assert [h[1] for h in history] == [_lloydmax_bytes(4, b) for b in (4, 3, 2)]
    # Each step re-encodes what the previous width decoded: the error grows as bits fall.
    errors = [(h[2] - keys[..., 40:44, :]).norm().item() for h in history]
    assert errors[0] < errors[1] < errors[2]


def test_retained_bytes_is_the_sum_over_segments_and_window():
    method = Decay(**PARAMS)
    cache = implementation(method).new_layer_cache(0)
    keys, values = randn(1, HEADS, 97, DIM, seed=5), randn(1, HEADS, 97, DIM, seed=6)
    for t in range(97):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
    kept, _, raw = _expected(97)
    expected = sum(_lloydmax_bytes(4, bits) for _, bits in kept) + 2 * HEADS * raw * DIM * 4
    assert cache.retained_bytes == expected
    assert cache.measured_bytes() == expected


def test_multi_token_appends_requantize_but_evict_only_at_end_prefill_or_one_token_steps():
    method = Decay(**PARAMS)
    cache = implementation(method).new_layer_cache(0)
    keys, values = randn(1, HEADS, 72, DIM, seed=7), randn(1, HEADS, 72, DIM, seed=8)
    cache.append(keys[..., :64, :], values[..., :64, :])
    # Nothing dropped inside the prefill step: every token is still there, the due ones at min.
    kept, evicted, raw = _expected(64)
    assert evicted > 0 and cache.retained_tokens == 64 and cache.counters()["tokens_evicted"] == 0
    due = [s for s in cache.segments if s.start < kept[0][0]]
    assert due and all(s.bits == 2 for s in due)
    assert [(s.start, s.bits) for s in cache.segments[len(due):]] == kept
    cache.end_prefill()
    assert [(s.start, s.bits) for s in cache.segments] == kept
    assert cache.counters()["tokens_evicted"] == evicted and cache.retained_tokens == 64 - evicted
    # A 4-token decode chunk keeps the count; the next one-token step catches up.
    cache.append(keys[..., 64:68, :], values[..., 64:68, :])
    assert cache.retained_tokens == 68 - evicted
    for t in range(68, 72):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
    kept, evicted, _ = _expected(72)
    assert [(s.start, s.bits) for s in cache.segments] == kept
    assert cache.counters()["tokens_evicted"] == evicted and cache.seen_tokens == 72


def test_upstream_default_rate_never_evicts():
    # exp(-1) = 0.37 > 0.3: the oldest token keeps more than min_bits... and is never evicted.
    method = Decay(base="lloydmax", base_bits=4, min_bits=1, window=0, segment=2)
    cache = implementation(method).new_layer_cache(0)
    x = randn(1, 1, 200, DIM, seed=9)
    for t in range(200):
        cache.append(x[..., t : t + 1, :], x[..., t : t + 1, :])
    assert cache.retained_tokens == 200 and cache.counters()["tokens_evicted"] == 0
    assert min(cache.segment_bits()) == 2  # 1 + 3 * exp(-1) = 2.10 -> 2, never the floor of 1


def test_kivi_base_uses_its_key_and_value_codecs():
    method = implementation(Decay(base="kivi", base_params={"group_size": 4, "residual": 0},
                                  base_bits=4, min_bits=2, decay_rate=4.0, window=2, segment=8))
    assert method.key_codec().format.axis == "channel" and method.value_codec().format.axis == "token"
    cache = method.new_layer_cache(0)
    x = randn(1, HEADS, 80, DIM, seed=10)
    for t in range(80):
        cache.append(x[..., t : t + 1, :], x[..., t : t + 1, :])
    assert cache.counters()["tokens_evicted"] > 0 and cache.counters()["tokens_requantized"] > 0
    k_out, v_out, _ = cache.attention_inputs()
    assert k_out.shape[-2] == cache.retained_tokens < 80


@pytest.mark.parametrize(
    "field, params",
    [("base", {"base": "identity"}), ("base", {"base": "no_such_method"}),
     ("base_bits", {"base_bits": 5}), ("base_bits", {"base_bits": 0}),
     ("min_bits", {"min_bits": 4}), ("min_bits", {"base": "intq", "base_bits": 4, "min_bits": 3}),
     ("base_params", {"base_params": {"bits": 3}}), ("base_params", {"base_params": {"nope": 1}}),
     ("base_params", {"base_params": {"window": 8}}), ("decay_rate", {"decay_rate": 0}),
     ("base_params", {"base": "intq", "base_bits": 4, "base_params": {"sinks": 4}}),
     ("window", {"window": -1}), ("segment", {"segment": 0}),
     ("segment", {"base": "kivi", "base_bits": 4, "segment": 48}),
     ("evict_below", {"evict_below": 0.5})],
)
def test_invalid_config_names_the_field(field, params):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        Decay(**params)


# --- through a real model -----------------------------------------------------------------------


def test_tiny_model_decodes_through_the_decayed_cache_with_positions_continuing(tiny_llama):
    loaded = tiny_llama
    model = loaded.model
    tokens = loaded.tokenizer.encode("Temporal decay forgets the distant past, bit by bit. " * 3)
    tokens = tokens[:90]
    method = Decay(**{**PARAMS, "window": 6, "segment": 8})
    positions = []
    hook = model.model.rotary_emb.register_forward_hook(
        lambda module, args, kwargs, out: positions.append(kwargs["position_ids"][0].tolist()),
        with_kwargs=True,
    )
    ids = torch.tensor([tokens])
    fed = len(tokens) - 1
    try:  # a prefill of 24 tokens, end_prefill, then one-token steps up to the last token
        _, cache = stepped_logits(model, method, ids[:, :fed], 24)
    finally:
        hook.remove()
    assert positions[0] == list(range(24))
    assert [p[0] for p in positions[1:]] == list(range(24, fed))
    assert cache.get_seq_length() == fed
    kept, evicted, _ = _expected(fed, {**PARAMS, "window": 6, "segment": 8})
    assert cache.retained_tokens() == [fed - evicted] * loaded.num_layers and evicted > 0
    counters = cache.counters()  # summed over both layers
    assert counters["tokens_evicted"] == loaded.num_layers * evicted
    assert counters["tokens_requantized"] > 0

    # The last step attends to exactly the decayed state, at the true position: a plain
    # DynamicCache holding what the decay cache returns (less the step's own token) and told the
    # position gives the same logits; left to count the tokens it holds, it gives others.
    def held():
        plain = DynamicCache(config=model.config)
        for i, policy in enumerate(cache.policies):
            k, v, _ = policy.attention_inputs()
            plain.update(k[..., :-1, :], v[..., :-1, :], i)
        return plain

    step = ids[:, fed : fed + 1]
    with torch.inference_mode():
        logits = cache.forward(model, step).logits
        same = model(step, past_key_values=held(), position_ids=torch.tensor([[fed]])).logits
        shifted = model(step, past_key_values=held()).logits  # position = tokens held
    torch.testing.assert_close(logits, same, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits, shifted, atol=1e-4)


def test_perplexity_reports_decay_counters():
    ctx = cpu_context("tiny:llama")
    params = PerplexityParams(context=64, continuation=16)
    method = implementation(Decay(**{**PARAMS, "window": 8, "segment": 8}))
    out = measurement(Perplexity).run(params, method, ctx)
    kept, evicted, raw = _expected(64 + 15, {**PARAMS, "window": 8, "segment": 8})
    assert out.info["tokens_evicted"] == 2 * evicted > 0  # both layers
    assert out.info["tokens_requantized"] > 0
    assert out.info["layout"].startswith("decay over lloydmax")
    # tiny: head_dim 16, 2 KV heads, float32 raw; bytes as lloydmax stores them, both layers
    per_layer = sum(2 * 2 * 8 * (4 + math.ceil(bits * 16 / 8)) for _, bits in kept)
    per_layer += 2 * 2 * raw * 16 * 4
    assert out.metrics["kv_bytes"].value == 2 * per_layer
    assert out.metrics["kv_bytes_measured"].value == 2 * per_layer


@pytest.mark.parametrize("params", [
    PARAMS,
    dict(PARAMS, base="turbo", base_params={"block": 16}, base_bits=4),
    dict(PARAMS, base="intq", base_params={"group_size": 8}, base_bits=4),
])
def test_the_fused_read_equals_decode_then_attention(params):
    """At every one-token step, on fresh random inputs, the fused CPU read of the decayed cache
    (its segments at every width, merged where they neighbour, and the raw tokens) equals
    decoding them, then attention; it covers evictions and every width the base accepts."""
    from kvbench.kernels.cpu.attention import decode_attention
    from kvbench.models.attention import biased_attention

    settings = Decay(**params)
    cache = implementation(settings).new_layer_cache(0)
    g = torch.Generator().manual_seed(5)
    keys, values = torch.randn(1, 2, 120, 32, generator=g), torch.randn(1, 2, 120, 32, generator=g)
    cache.append(keys[..., :40, :], values[..., :40, :])
    cache.end_prefill()
    fused, widths = 0, set()
    for t in range(40, 120):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
        read = cache.attention_segments()
        k, v, _ = cache.attention_inputs()
        q = torch.randn(1, 4, 1, 32, generator=g)
        reference = biased_attention(q, k, v, None, None)[0]
        assert read is not None and read.kernel == "cpu" and read.tokens == k.shape[-2]
        mine = decode_attention(q, read.segments)
        assert (mine - reference).abs().max() <= 1e-5 * reference.abs().max()
        fused += 1
        widths.update(cache.segment_bits())
    assert cache.tokens_evicted > 0 and widths == set(settings.widths()) and fused == 80


def test_a_model_decodes_through_the_fused_read(tiny_sessions):
    """On a tiny llama, the decayed cache's one-token steps are read by the fused CPU kernel and
    give the logits of the same segments decoded, then attended (the base's impl torch)."""
    from kvbench.models.session import prefill

    session = tiny_sessions("llama")
    ids = torch.randint(4, 260, (76,), generator=torch.Generator().manual_seed(11)).tolist()
    logits = {}
    for impl in ("auto", "torch"):
        settings = Decay(**{**PARAMS, "base": "turbo", "window": 6, "segment": 8,
                            "base_params": {"block": 16, "impl": impl}})
        method = implementation(settings)
        cache = session.new_cache(method)
        prefill(session, cache, ids[:60], method)
        logits[impl] = torch.cat([session.step([token], cache)[0] for token in ids[60:]])
        if impl == "auto":
            assert method.impl_log.summary()["decode attention"] == "cpu"
            assert cache.counters()["tokens_evicted"] > 0
    assert (logits["auto"] - logits["torch"]).abs().max() < 1e-4 * logits["torch"].abs().max()
