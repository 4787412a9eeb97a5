"""Quantizers on sliding-window layers (`layers: all`, the default, as vLLM's fp8 KV cache and
llama.cpp's -ctk/-ctv quantize them; kvbench.methods.core.window_cache), on the tiny families
whose layers are windows (Mistral, Ministral 3: every layer; Gemma 2 / 3, gpt-oss: one of two).

The reference: the model's own eager attention over transformers' own cache, whose layers store
each token as the codec's float reference gives it back (decode(encode(x))): the same windowed
K/V, quantized, the step's own tokens read as the model made them (prefill_reads "exact").
Tolerance PARITY = 1e-5 of the logits' largest magnitude (float32; kvbench's attention and the
fused CPU read sum in another order than eager attention)."""
from __future__ import annotations

import pytest
import torch

from kvbench.methods import build_method, implementation
from kvbench.models.hf_cache import held_bytes, with_cache
from kvbench.models.info import describe_model
from kvbench.models.layer_kinds import SLIDING, hosted_layers, refusal
from kvbench.models.session import TorchSession, plain_kv_bytes
from kvbench.models.tiny import build_tiny
from kvbench.models.tiny_configs import WINDOW

CHUNKS, STEPS = (24, 16, 5), 6  # the prompt in chunks, the window passed inside the second
PROMPT = sum(CHUNKS)
IDS = torch.randint(4, 260, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(11)).tolist()
PARITY = 1e-5
WINDOWED = ["mistral", "ministral3", "gemma3", "gemma2", "gpt_oss"]
INTQ4 = {"bits": 4}


def chunks(ids: list[int]):
    """The prompt's chunks, then one token a step."""
    start = 0
    for size in CHUNKS:
        yield ids[start : start + size]
        start += size
    for token in ids[PROMPT:-1]:
        yield [token]


def method_logits(session: TorchSession, settings) -> tuple[torch.Tensor, object]:
    """Every chunk's last logits and every step's, through the method's cache."""
    method = implementation(settings)
    cache = session.new_cache(method)
    rows = []
    for i, part in enumerate(chunks(IDS)):
        rows.append(session.step(part, cache)[0][-1])
        if i == len(CHUNKS) - 1:
            cache.end_prefill()
    return torch.stack(rows), cache


@torch.inference_mode()
def reference_logits(kind: str, settings, windows: bool = True) -> tuple[torch.Tensor, object]:
    """The same through the eager model and transformers' own cache, each layer storing what
    the codec's torch reference gives back (`windows` False: the sliding layers store the
    tokens as made, the library's as under layers: full)."""
    from transformers import DynamicCache

    codec = implementation(build_method(type(settings).name, {**settings.params(),
                                                              "impl": "torch"})).codec()
    model, _ = build_tiny(kind, "eager")
    cache = DynamicCache(config=model.config)
    kinds = describe_model(f"tiny:{kind}").layer_kinds
    for layer, layer_kind in zip(cache.layers, kinds):
        if windows or layer_kind.mixer != SLIDING:
            layer.update = stored_as(layer.update, codec)
    rows = [model(torch.tensor([part]), **with_cache(model, cache)).logits[0, -1]
            for part in chunks(IDS)]
    return torch.stack(rows).float(), cache


def stored_as(update, codec):
    """A library layer's update that stores decode(encode(x)) and reads the step as given."""
    def quantized(x):
        return codec.decode(codec.encode(x)).to(x.dtype)

    def wrapped(keys, values, *args, **kwargs):
        stored_k, stored_v = update(quantized(keys), quantized(values), *args, **kwargs)
        n = keys.shape[-2]
        return (torch.cat([stored_k[..., :-n, :], keys], -2),
                torch.cat([stored_v[..., :-n, :], values], -2))
    return wrapped


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kind", WINDOWED)
def test_intq4_compresses_every_layer_and_reads_the_window_as_the_model(kind, tiny_sessions):
    session = tiny_sessions(kind)
    for layers in ("all", None):  # unset: all, what engines do
        mine, cache = method_logits(session, build_method("intq", {**INTQ4, "layers": layers}))
        assert len(cache.policies) == session.num_layers and not cache.library_layers
    windowed = [p for p, k in zip(cache.policies, session.layer_kinds) if k.mixer == SLIDING]
    assert windowed and all(p.retained_tokens == WINDOW - 1 for p in windowed)
    assert all(p.seen_tokens == len(IDS) - 1 for p in cache.policies)
    # the reference path (decode, then attention): the fused read's own parity is below (its
    # float rounding may flip a later token's 4-bit code, so whole runs are not compared)
    mine, _ = method_logits(session, build_method("intq", {**INTQ4, "impl": "torch"}))
    reference, _ = reference_logits(kind, build_method("intq", INTQ4))
    assert relative(mine, reference) <= PARITY
    plain, _ = reference_logits(kind, build_method("intq", INTQ4), windows=False)
    assert relative(mine, plain) > 100 * PARITY  # the windows' quantization shows


@pytest.mark.parametrize("kind", ["mistral", "gemma3"])
def test_a_windowed_layers_bytes_stay_below_the_plain_windows(kind, tiny_sessions):
    from transformers import DynamicCache

    session = tiny_sessions(kind)
    plain = DynamicCache(config=session.loaded.model.config)
    for part in chunks(IDS):
        session.step(part, plain)
    figures = {}
    for name, params in (("identity", {}), ("intq", {**INTQ4, "layers": "full"}),
                         ("intq", INTQ4), ("turbo3", {"block": 16}),
                         ("kivi", {"residual": 128})):
        _, cache = method_logits(session, build_method(name, params))
        figures[name, params.get("layers")] = cache.accounted_bytes()
        # the ratios' plain cache: what the plain cache holds, a window's W - 1 tokens included
        assert plain_kv_bytes(session, cache)[1] == figures["identity", None]
        for i, policy in zip(hosted_layers(cache.method, session.layer_kinds), cache.policies):
            window = held_bytes(plain.layers[i])
            if session.layer_kinds[i].mixer == SLIDING:
                assert policy.retained_bytes <= window
                assert policy.measured_bytes() <= window
    # KIVI below its residual keeps the window raw: the plain window's bytes, no more
    assert figures["kivi", None] == figures["identity", None]
    assert figures["intq", None] < figures["intq", "full"] <= figures["identity", None]


@pytest.mark.parametrize("kind", ["gemma3", "gpt_oss"])
def test_layers_full_keeps_the_library_windows(kind, tiny_sessions):
    """layers: full is what kvbench did before: transformers' own window layer, the method's
    policy on the full layer only, the float reference of exactly that."""
    session = tiny_sessions(kind)
    mine, cache = method_logits(session, build_method("intq", {**INTQ4, "layers": "full",
                                                               "impl": "torch"}))
    window = cache.library_layers[0]
    assert len(cache.policies) == 1 and window.is_sliding
    assert window.keys.shape[-2] == WINDOW - 1
    reference, _ = reference_logits(kind, build_method("intq", INTQ4), windows=False)
    assert relative(mine, reference) <= PARITY


def test_layers_changes_nothing_on_a_model_without_windows(tiny_sessions):
    session = tiny_sessions("llama")
    logits = [method_logits(session, build_method("intq", {**INTQ4, "layers": layers}))[0]
              for layers in (None, "all", "full")]
    assert all(torch.equal(logits[0], other) for other in logits[1:])


@pytest.mark.parametrize("kind", WINDOWED)
def test_kivi_below_its_residual_is_lossless_on_every_window(kind, tiny_sessions):
    session = tiny_sessions(kind)
    mine, cache = method_logits(session, build_method("kivi", {"residual": 128}))
    assert len(cache.policies) == session.num_layers
    model, _ = build_tiny(kind, "eager")
    from transformers import DynamicCache

    own = DynamicCache(config=model.config)
    with torch.inference_mode():
        eager = torch.stack([model(torch.tensor([part]), **with_cache(model, own)).logits[0, -1]
                             for part in chunks(IDS)]).float()
    assert relative(mine, eager) <= PARITY


def test_kivi_above_its_residual_drops_whole_key_groups_and_reads_the_window():
    """KIVI's keys per channel in groups of 8 tokens over a window of 32: the tokens of a group
    still partly in the window stay packed, unread; what it reads is the float reference of
    what it stores (decode, then the window's tokens), with the newest tokens as appended."""
    from kvbench.models.attention import biased_attention

    settings = build_method("kivi", {"group_size": 8, "residual": 8, "bits": 4, "impl": "torch"})
    method = implementation(settings)
    cache = method.new_window_cache(0, WINDOW)
    g = torch.Generator().manual_seed(5)
    keys, values = torch.randn(1, 2, 70, 16, generator=g), torch.randn(1, 2, 70, 16, generator=g)
    cache.append(keys[..., :45, :], values[..., :45, :])
    cache.after_read()
    hidden = 0
    for t in range(45, 70):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
        read_k, read_v, _ = cache.attention_inputs()
        assert read_k.shape[-2] == WINDOW and cache.seen_tokens == t + 1
        stored = [torch.cat([s.codec.decode(p) for p in s.packed] + [s.raw], -2)[..., s.hidden:, :]
                  for s in (cache.keys, cache.values)]
        q = torch.randn(1, 4, 1, 16, generator=g)
        assert torch.equal(biased_attention(q, read_k, read_v, None, None)[0],
                           biased_attention(q, *stored, None, None)[0])
        assert torch.equal(read_k[..., -1:, :], keys[..., t : t + 1, :])
        cache.after_read()
        hidden = max(hidden, cache.keys.hidden)
    assert cache.retained_tokens == WINDOW - 1 and hidden > 0
    assert cache.keys.packed_tokens - cache.keys.hidden + cache.keys.raw_tokens == WINDOW - 1


@pytest.mark.parametrize("name, params", [("intq", INTQ4), ("turbo3", {"block": 16}),
                                          ("lloydmax", {}), ("kivi", {"group_size": 8,
                                                                      "residual": 8})])
def test_the_fused_read_reads_the_window(name, params):
    """At every one-token step, on fresh random inputs, the fused CPU read of a windowed cache
    (its packed segments and the step as made) equals decode, then attention over the same
    window (attention_inputs_exact); every key it holds is in the window."""
    from kvbench.kernels.cpu.attention import decode_attention
    from kvbench.models.attention import biased_attention

    method = implementation(build_method(name, params))
    cache = method.new_window_cache(0, WINDOW)
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(1, 2, 80, 32, generator=g), torch.randn(1, 2, 80, 32, generator=g)
    cache.append(keys[..., :45, :], values[..., :45, :])
    cache.after_read()
    fused = 0
    for t in range(45, 80):
        step = keys[..., t : t + 1, :], values[..., t : t + 1, :]
        cache.append(*step)
        read = cache.attention_segments(step)
        k, v, _ = cache.attention_inputs_exact(*step) or cache.attention_inputs()
        assert k.shape[-2] == WINDOW
        q = torch.randn(1, 4, 1, 32, generator=g)
        reference = biased_attention(q, k, v, None, None)[0]
        if read is not None:
            assert read.kernel == "cpu" and sum(s.tokens for s in read.segments) == WINDOW
            mine = decode_attention(q, read.segments)
            assert (mine - reference).abs().max() <= PARITY * reference.abs().max()
            fused += 1
        cache.after_read()
    assert fused >= 20  # KIVI's groups: read fused from inside a group too


def test_a_decode_step_on_every_window_is_read_fused(tiny_sessions):
    session = tiny_sessions("mistral")
    method = implementation(build_method("intq", INTQ4))
    cache = session.new_cache(method)
    for part in chunks(IDS):
        session.step(part, cache)
    assert method.impl_log.summary()["decode attention"] == "cpu"


def test_a_window_that_moved_cannot_be_rewound(tiny_sessions):
    session = tiny_sessions("mistral")
    _, cache = method_logits(session, build_method("intq", INTQ4))
    with pytest.raises(ValueError, match="can take back only 0 of the 2 newest tokens"):
        session.trim(cache, 2)


def test_refusals_say_which_windows_a_method_leaves_to_the_library():
    mistral = describe_model("tiny:mistral").layer_kinds
    assert refusal(build_method("intq", INTQ4), mistral) is None
    assert "no layer to compress: every layer is sliding window of 32" in refusal(
        build_method("intq", {**INTQ4, "layers": "full"}), mistral)
    assert "quantizers sliding-window layers too" in refusal(
        build_method("snapkv", {"ratio": 0.5}), mistral)
    llama4 = describe_model("tiny:llama4").layer_kinds
    assert hosted_layers(build_method("intq"), llama4) == [3]  # chunks: the library's
    why = refusal(build_method("intq", {"layers": "all"}), llama4)
    assert "layers 0, 1, 2: attention in chunks of 32; a query attends within its own chunk" \
        in why and "layers: all asks for every attention layer" in why
    gemma3 = describe_model("tiny:gemma3").layer_kinds
    decay = build_method("decay", {"base": "intq", "base_bits": 4,
                                   "base_params": {"layers": "all"}})
    assert "layer 0: sliding window of 32; 'decay' keeps sliding-window layers to the library" \
        in refusal(decay, gemma3)
    sparse = build_method("sparse_v", {"base": "intq", "base_params": {"layers": "all"}})
    assert refusal(sparse, gemma3) is None and hosted_layers(sparse, gemma3) == [0, 1]


def test_validate_blames_a_bad_layers_value_at_its_line(tmp_path):
    from tests.plugins.cli_support import invoke

    suite = tmp_path / "s.yaml"
    suite.write_text("kvbench: 1\nname: t\ndefaults: {model: tiny:mistral}\nmethods:\n"
                     "  - name: intq\n    params: {layers: some}\n"
                     "benchmarks:\n  - kind: parity\n")
    result = invoke("validate", suite)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "s.yaml:6" in text and "layers" in text and "'all' or 'full'" in text


@pytest.mark.parametrize("prefill_reads", ["stored"])
def test_mlx_reads_the_window_as_the_float_reference(prefill_reads):
    """On MLX (gemma3; mlx-lm runs Mistral without its window, refused): intq4 holds both
    layers, and its logits are mlx-lm's own caches' storing decode(encode(x)) of the MLX codec
    (every token read as stored: mlx-lm's rotating buffer returns a step out of order)."""
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from kvbench.models.mlx_host import MLXKVBenchCache, mlx_logits
    from kvbench.models.mlx_loading import load_mlx_model

    loaded = load_mlx_model("tiny:gemma3")
    settings = build_method("intq", {**INTQ4, "prefill_reads": prefill_reads})
    method = implementation(settings, "mlx")
    cache = MLXKVBenchCache(method, loaded.num_layers, model=loaded.model,
                            kinds=loaded.layer_kinds)
    codec = method.codec()
    own = make_prompt_cache(loaded.model)
    for layer in own:
        update = layer.update_and_fetch
        layer.update_and_fetch = (lambda k, v, update=update: update(
            codec.decode(codec.encode(k)).astype(k.dtype),
            codec.decode(codec.encode(v)).astype(v.dtype)))
    rows = {"mine": [], "reference": []}
    for part in chunks(IDS):
        for name, layers in (("mine", cache), ("reference", own)):
            out = mlx_logits(loaded.model, mx.array([part]), layers)[0, -1]
            mx.eval(out)
            rows[name].append(np.array(out.astype(mx.float32)))
    assert len(cache.policies) == loaded.num_layers
    assert cache.policies[0].retained_tokens == WINDOW - 1
    mine, reference = np.stack(rows["mine"]), np.stack(rows["reference"])
    assert np.abs(mine - reference).max() <= PARITY * np.abs(reference).max()
