"""The tiny architecture families (kvbench.models.tiny_configs) on MLX: mlx-lm hosts the
full-attention layers with the method's policies and every other layer with its own cache
(kvbench.models.mlx_host), and a model mlx-lm would run otherwise than torch is refused at load
(kvbench.models.mlx_architectures).

Tolerances, and why:
- identity through MLXKVBenchCache vs mlx-lm's own caches (make_prompt_cache), same model:
  IDENTICAL = 1e-5 (the same keys and values reach the same attention; only where they are
  stored differs).
- MLX vs the torch eager model on the same weights and token ids: TORCH_RTOL = 1e-4 of the
  logits' largest magnitude (both float32, the matmuls summed in another order; a recurrent
  state or a Mamba scan in another order too). The prefill is longer than the sliding window
  and the decode steps go further, so a window ignored or misplaced shows (logits off by ~1).
  Gemma 3: GEMMA3_RTOL = 2e-4 (measured 7e-5): mlx-lm scales the embeddings by sqrt(hidden)
  rounded to bfloat16, as Gemma's reference does, transformers by the float32 value (1e-4
  apart); with the float32 scale the two agree to 5e-7.
"""
from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import torch  # noqa: E402

from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.models.mlx_host import (  # noqa: E402
    MLXKVBenchCache,
    cache_arrays,
    library_nbytes,
    mlx_logits,
)
from kvbench.models.mlx_loading import load_mlx_model  # noqa: E402
from kvbench.models.mlx_architectures import rope_overrides  # noqa: E402
from kvbench.models.tiny_configs import WINDOW  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The families mlx-lm runs as torch does, and those it refuses, with the refusal's words.
HOSTED = ["gemma3", "deepseek_v3", "qwen3_moe", "qwen3_5", "qwen3_next",
          "falcon_h1", "jamba", "cohere2", "olmo3", "smollm3", "lfm2", "granitemoehybrid",
          "mamba2"]
REFUSED = {
    "mistral": r"mlx-lm's mistral \(mlx_lm.models.llama\) ignores sliding_window=32; torch"
               r" runs it",
    "gemma2": r"mlx-lm's gemma2 ignores sliding_window=32; torch runs it",
    # transformers' gpt-oss config (as OpenAI's) sets truncate=False; with True the two agree
    "gpt_oss": r"mlx-lm's gpt_oss ignores the YaRN RoPE's truncate=False",
    "llama4": r"mlx-lm's llama4_text ignores sliding_window=32",
    "ministral3": r"mlx-lm's ministral3 ignores sliding_window=32",
    "nemotron_h": r"mlx-lm's nemotron_h builds 2 layers' caches, the config 4 layers",
    "gemma3n": r"mlx-lm has no gemma3n_text architecture|another's cache on torch only",
    "zamba2": r"mlx-lm has no zamba2 architecture",
    # the tiny configs leave these to transformers' defaults, which mlx-lm's arguments require
    "exaone4": r"mlx-lm's exaone4 needs rope_scaling in the config",
    "glm4_moe": r"mlx-lm's glm4_moe needs rope_scaling in the config",
    "kimi_linear": r"mlx-lm's kimi_linear needs rope_theta, linear_attn_config in the config",
    "minimax": r"mlx-lm's minimax needs shared_intermediate_size, rotary_dim in the config",
}
PREFILL, DECODE = 40, 8  # the prefill alone is longer than the window (32)
IDENTICAL = 1e-5
TORCH_RTOL = 1e-4
GEMMA3_RTOL = 2e-4

_LOADED: dict = {}


def loaded(kind: str):
    """One MLX model per family for this module."""
    if kind not in _LOADED:
        _LOADED[kind] = load_mlx_model(f"tiny:{kind}")
    return _LOADED[kind]


def _ids() -> list[int]:
    rng = np.random.default_rng(7)
    return rng.integers(4, 260, PREFILL + DECODE).tolist()


def _stepped(model, cache, ids: list[int], method_cache: MLXKVBenchCache | None = None):
    """Logits (tokens, vocab) of a prefill of ids[:PREFILL] then one-token steps."""
    rows = [mlx_logits(model, mx.array([ids[:PREFILL]]), cache)[0]]
    if method_cache is not None:
        method_cache.end_prefill()
    for i in range(PREFILL, len(ids)):
        rows.append(mlx_logits(model, mx.array([ids[i:i + 1]]), cache)[0])
        mx.eval(rows[-1], cache_arrays(cache))
    return np.array(mx.concatenate(rows).astype(mx.float32))


def _method_logits(kind: str, name: str, params: dict | None = None):
    model = loaded(kind)
    cache = MLXKVBenchCache(implementation(build_method(name, params), "mlx"), model.num_layers,
                            model=model.model, kinds=model.layer_kinds)
    return _stepped(model.model, cache, _ids(), cache), cache


@pytest.mark.parametrize("kind", HOSTED)
def test_identity_is_mlx_lm_and_torch(kind):
    from mlx_lm.models.cache import make_prompt_cache

    from kvbench.models.tiny import build_tiny

    model = loaded(kind)
    ids = _ids()
    got, cache = _method_logits(kind, "identity")
    # only full-attention and hybrid layers' attention hold policies; the rest is mlx-lm's
    full = [i for i, k in enumerate(model.layer_kinds) if k.compressed]
    assert [h.layer_idx for h in cache.hosts] == full
    reference = make_prompt_cache(model.model)
    assert [type(layer) for layer in cache.library_layers] == \
        [type(reference[i]) for i in range(model.num_layers) if i not in full]
    expected = _stepped(model.model, reference, ids)
    np.testing.assert_allclose(got, expected, atol=IDENTICAL, rtol=0)

    torch_model, _ = build_tiny(kind, "eager")
    with torch.inference_mode():
        eager = torch_model(torch.tensor([ids])).logits[0].float().numpy()
    rtol = GEMMA3_RTOL if kind == "gemma3" else TORCH_RTOL
    np.testing.assert_allclose(got, eager, rtol=0, atol=rtol * np.abs(eager).max())


# linear + full; sliding + full; hybrid (attention and Mamba state in every layer)
@pytest.mark.parametrize("kind", ["qwen3_next", "gemma3", "falcon_h1"])
def test_a_lossy_method_runs_and_counts_the_library_layers(kind):
    # layers: full leaves gemma3's window to mlx-lm (tests/test_sliding_quantizers.py: all)
    got, cache = _method_logits(kind, "intq", {"bits": 4, "layers": "full"})
    assert np.isfinite(got).all()
    states = [part for host in cache.hosts for part in getattr(host, "library_parts", ())]
    assert bool(states) == (kind == "falcon_h1")
    library = sum(library_nbytes(layer) for layer in [*cache.library_layers, *states])
    assert library > 0 and cache.library_bytes() == library
    assert cache.accounted_bytes() == \
        sum(policy.retained_bytes for policy in cache.policies) + library
    assert cache.measured_bytes() == \
        sum(policy.measured_bytes() for policy in cache.policies) + library
    identity, _ = _method_logits(kind, "identity")
    assert 0 < np.abs(got - identity).max()  # 4-bit keys and values change the logits


def test_a_sliding_layer_is_mlx_lms_window():
    model = loaded("gemma3")
    _, cache = _method_logits("gemma3", "identity")
    window = cache.library_layers[0]
    assert type(window).__name__ == "RotatingKVCache" and window.max_size == WINDOW
    assert model.layer_kinds[0].window == WINDOW
    assert window.keys.shape[-2] == WINDOW  # what it holds: the window, not every token


def test_the_session_hosts_the_library_layers_and_refuses_to_trim_a_state():
    from kvbench.models.mlx_session import MLXSession

    session = MLXSession(loaded("qwen3_next"))
    cache = session.new_cache(implementation(build_method("identity"), "mlx"))
    assert [type(layer).__name__ for layer in cache.layers] == ["ArraysCache", "MLXPolicyLayer"]
    ids = _ids()
    logits, _ = session.step(ids[:PREFILL], cache, last_only=True)
    plain = session.new_cache(None)
    expected, _ = session.step(ids[:PREFILL], plain, last_only=True)
    torch.testing.assert_close(logits, expected, atol=IDENTICAL, rtol=0)
    with pytest.raises(ValueError, match="ArraysCache of layer 0 cannot"):
        session.trim(cache, 2)


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_feature_mlx_lm_ignores_is_refused_at_load(kind):
    with pytest.raises(ValueError, match=REFUSED[kind]):
        load_mlx_model(f"tiny:{kind}")


def test_the_kinds_are_the_configs():
    kinds = loaded("gemma3").layer_kinds
    assert [(k.mixer, k.window, k.sinks) for k in kinds] == \
        [("sliding", WINDOW, False), ("full", None, False)]
    mla = loaded("deepseek_v3")  # MLA: one latent "head", as torch caches it
    assert (mla.num_kv_heads, mla.head_dim, mla.value_dim) == (1, 32, 8)


def test_what_mlx_lm_would_miss_in_a_transformers_5_config():
    from kvbench.models.mlx_architectures import mlx_overrides

    per_type = {"rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                    "sliding_attention": {"rope_theta": 1e4}}}
    assert rope_overrides(per_type) == {"rope_theta": 1e6, "rope_local_base_freq": 1e4}
    partial = {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.25}}
    assert rope_overrides(partial) == {"rope_theta": 1e4, "partial_rotary_factor": 0.25}
    gemma3 = {"model_type": "gemma3_text", "rope_theta": 1e6, "rope_local_base_freq": 1e4,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    assert mlx_overrides(gemma3) == {"sliding_window_pattern": 4}
    qwen = {"model_type": "qwen3_5_text", "rope_theta": 1e4,
            "layer_types": ["linear_attention", "full_attention"]}
    assert mlx_overrides(qwen) == {"model_type": "qwen3_5", "full_attention_interval": 2}


def test_an_architecture_mlx_lm_lacks_is_refused():
    from kvbench.models.mlx_architectures import architecture

    with pytest.raises(ValueError, match="mlx-lm has no not_a_model architecture"):
        architecture({"model_type": "not_a_model"})


def test_attention_entropy_skips_the_linear_layers_and_keeps_the_window():
    import math

    from kvbench.models.mlx_session import MLXSession, attention_entropy

    ids = _ids()
    hybrid = MLXSession(loaded("qwen3_next"))
    entropy = attention_entropy(hybrid.loaded, ids, frozenset({0}))
    assert entropy.shape == (2, 4) and entropy[0].isnan().all() and entropy[1].isfinite().all()
    # a sliding layer's rows see at most the window: less entropy than log2 of the keys allows
    sliding = attention_entropy(loaded("gemma3"), ids)
    assert sliding.isfinite().all()
    assert (sliding[0] <= math.log2(WINDOW) + 1e-9).all()


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_validate_refuses_on_mlx_what_loading_would(kind, tmp_path):
    """The same check before any work (mlx-lm's model built without weights): every case of the
    family refused with the reason, on backend mlx only."""
    import re

    from kvbench import load_suite

    suite = tmp_path / "s.yaml"
    suite.write_text(f"kvbench: 1\nname: t\ndefaults: {{model: tiny:{kind}, backend: mlx}}\n"
                     "methods:\n  - name: identity\nbenchmarks:\n  - kind: parity\n")
    [case] = load_suite(suite).cases
    assert case.refused_as == "LayersUnsupported" and re.search(REFUSED[kind], case.refused)
    suite.write_text(suite.read_text().replace(", backend: mlx", ""))
    [case] = load_suite(suite).cases
    assert case.refused is None  # torch runs it


@pytest.mark.parametrize("kind", HOSTED)
def test_every_shipped_method_runs_or_is_refused_on_mlx(kind):
    """What validation lets through on backend mlx runs a prefill and two steps in mlx-lm's
    cache, each byte counted."""
    from kvbench.methods import METHODS, has_implementation
    from kvbench.models.info import describe_model, method_refusal
    from kvbench.models.mlx_session import MLXSession
    from kvbench.models.session import prefill

    session, info, ids = MLXSession(loaded(kind)), describe_model(f"tiny:{kind}"), _ids()
    failures, ran = {}, []
    for name in METHODS.names():
        if METHODS.get(name).library_cache:  # refused on every family here but the plain ones
            continue
        settings = build_method(name, METHODS.get(name).conformance_params[0])
        if method_refusal(settings, info, backend="mlx") or \
                not has_implementation(type(settings), "mlx"):
            continue
        method = implementation(settings, "mlx")
        try:
            if hasattr(method, "calibrate"):
                session.calibrate(method, ids[:PREFILL])
            cache = session.new_cache(method)
            prefill(session, cache, ids[:PREFILL], method)
            for token in ids[PREFILL : PREFILL + 2]:
                session.step([token], cache)
        except Exception as exc:  # noqa: BLE001 - every failure is listed, not the first
            failures[name] = f"{type(exc).__name__}: {exc}"
            continue
        ran.append(name)
        assert all(policy.retained_bytes > 0 for policy in cache.policies)
    assert not failures and "identity" in ran
