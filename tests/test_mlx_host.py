"""mlx-lm as kvbench's MLX host: attention reads the kvbench cache, positions continue after
eviction, the per-key bias and sparse-V reach mlx-lm's attention, and MLX agrees with torch.

Tolerances, and why:
- kvbench identity cache vs mlx-lm's KVCache, same model: 1e-6 (the same keys and values reach
  the same mx.fast attention; only how they are stored differs).
- kvbench's explicit float32 attention vs mx.fast (zero bias vs no bias): 1e-4 on logits, as
  the torch twin in tests/test_attention.py (softmax and matmul order differ, both float32).
- torch vs MLX on the same float32 weights: logits within 1e-3 (measured ~1e-4 on the bundled
  model: float32 with a different matmul order, 30 layers); perplexity within 1e-4 relative
  (measured ~1e-6: both score in float64 from float32 logits).
The policies are defined here (not kvbench's registered MLX methods) so these tests exercise the
host alone.
"""
import json
import math

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import torch  # noqa: E402

from kvbench.backends import mlx_backend  # noqa: E402
from kvbench.methods.core.contracts import LayerCachePolicy  # noqa: E402
from kvbench.models import mlx_host  # noqa: E402
from kvbench.models.mlx_attention import biased_attention  # noqa: E402
from kvbench.models.mlx_host import MLXKVBenchCache  # noqa: E402
from kvbench.models.mlx_loading import load_mlx_model  # noqa: E402
from kvbench.models.mlx_architectures import rope_overrides  # noqa: E402

# torch's OpenMP workers spin-wait: on a busy 2-core machine a bundled-model decode step took
# 1.6 s with 2 threads and 0.07 s with one. Nothing here is timed.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

BUNDLED = "bundled:smollm2-135m"


# ---- policies (MLX, defined here) -------------------------------------------------------------

class Keep(LayerCachePolicy):
    """Keeps every key and value as given (an MLX identity)."""

    def __init__(self):
        self.keys = self.values = None
        self.seen = 0

    def append(self, keys, values, queries=None):
        self.seen += keys.shape[-2]
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=-2)
            self.values = mx.concatenate([self.values, values], axis=-2)

    def attention_inputs(self):
        return self.keys, self.values, None

    @property
    def seen_tokens(self):
        return self.seen

    @property
    def retained_tokens(self):
        return self.keys.shape[-2]

    @property
    def retained_bytes(self):
        return self.keys.nbytes + self.values.nbytes

    def measured_bytes(self):
        return self.keys.nbytes + self.values.nbytes


class ZeroValues(Keep):
    def attention_inputs(self):
        return self.keys, mx.zeros_like(self.values), None


class Biased(Keep):
    """Keeps everything; adds bias_fn(lead, tokens) to the logits of its keys."""

    def __init__(self, bias_fn):
        super().__init__()
        self.bias_fn = bias_fn

    def attention_inputs(self):
        return self.keys, self.values, self.bias_fn(self.keys.shape[:2], self.keys.shape[-2])


class DropPrefix(Keep):
    """Keeps everything until a token beyond the first `n` arrives, then drops those n."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def append(self, keys, values, queries=None):
        super().append(keys, values)
        if self.seen - keys.shape[-2] <= self.n < self.seen:
            self.keys, self.values = self.keys[..., self.n:, :], self.values[..., self.n:, :]


class SparseKeep(Keep):
    def __init__(self, tau):
        super().__init__()
        self.value_skip_threshold = tau
        self.totals = {"sparse_v_rows_skipped": 0.0, "sparse_v_rows": 0.0,
                       "sparse_v_output_error_sum": 0.0, "sparse_v_steps": 0.0}

    def record_sparse_v(self, rows_skipped, rows, output_error):
        for name, value in zip(self.totals, (rows_skipped, rows, output_error, 1)):
            self.totals[name] += value

    def counters(self):
        return dict(self.totals)


class Overclaims(Keep):
    @property
    def retained_tokens(self):
        return self.seen + 1


class Policy:
    """A method for MLXKVBenchCache: one `factory()` per layer."""

    prefill_reads = "stored"

    def __init__(self, factory):
        self.factory = factory

    def new_layer_cache(self, layer_idx):
        return self.factory()

    def reference_probe(self, prompt):
        return []  # no reference queries to feed before end_prefill


def hide_prefix_after_prefill(n):
    def bias(lead, tokens):
        if tokens <= n:
            return mx.zeros((*lead, tokens))
        return mx.concatenate([mx.full((*lead, n), -1e9), mx.zeros((*lead, tokens - n))], -1)
    return bias


# ---- helpers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return load_mlx_model("tiny:llama")


def _ids(n=40):
    return np.random.default_rng(3).integers(0, 256, n).tolist()


def _decode_logits(loaded, cache, ids, prefill):
    """Prefill `prefill` tokens, then one-token steps; the logits of the steps, (steps, vocab)."""
    layers = cache if isinstance(cache, list) else cache.layers
    loaded.model(mx.array([ids[:prefill]]), cache=layers)
    steps = [loaded.model(mx.array([ids[i:i + 1]]), cache=layers)[0, -1]
             for i in range(prefill, len(ids))]
    return np.array(mx.stack(steps))


def _kvbench_logits(loaded, factory, ids, prefill=10):
    cache = MLXKVBenchCache(Policy(factory), loaded.num_layers)
    return _decode_logits(loaded, cache, ids, prefill), cache


def _mlx_lm_logits(loaded, ids, prefill=10):
    from mlx_lm.models.cache import make_prompt_cache

    return _decode_logits(loaded, make_prompt_cache(loaded.model), ids, prefill)


def _greedy_mlx(model, prompt, steps, cache):
    """(tokens, logits (steps, vocab)) of greedy decoding after `prompt` through `cache`."""
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    tokens, rows = [], []
    for _ in range(steps):
        rows.append(np.array(logits))
        tokens.append(int(rows[-1].argmax()))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens, np.stack(rows)


@torch.inference_mode()
def _greedy_torch(loaded, prompt, steps):
    from transformers import DynamicCache

    cache = DynamicCache(config=loaded.model.config)
    logits = loaded.model(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits
    tokens, rows = [], []
    for _ in range(steps):
        rows.append(logits[0, -1].numpy())
        tokens.append(int(rows[-1].argmax()))
        logits = loaded.model(torch.tensor([[tokens[-1]]]), past_key_values=cache,
                              use_cache=True).logits
    return tokens, np.stack(rows)


def _agreement(torch_loaded, mlx_model, cache, steps=8):
    """(same greedy tokens, max |logit difference| along the way) after PROMPT."""
    prompt = torch_loaded.tokenizer.encode(PROMPT)
    expected, expected_logits = _greedy_torch(torch_loaded, prompt, steps)
    got, logits = _greedy_mlx(mlx_model, prompt, steps, cache)
    return got == expected, float(np.abs(logits - expected_logits).max())


@torch.inference_mode()
def _torch_perplexity(loaded, ids, context):
    """kvbench.benchmarks.measure.perplexity's protocol on torch with its plain cache: prefill, then
    one-token decode, token i scored from the logits at i-1, NLL in float64."""
    from transformers import DynamicCache

    cache = DynamicCache(config=loaded.model.config)

    def step(chunk, keep=0):
        return loaded.model(torch.tensor([chunk]), past_key_values=cache, use_cache=True,
                            logits_to_keep=keep).logits[0].double()

    nll = torch.nn.functional.cross_entropy(step(ids[:context], keep=1),
                                            torch.tensor(ids[context:context + 1]),
                                            reduction="sum").item()
    for i in range(context, len(ids) - 1):
        nll += torch.nn.functional.cross_entropy(step(ids[i:i + 1]), torch.tensor([ids[i + 1]]),
                                                 reduction="sum").item()
    return math.exp(nll / (len(ids) - context))


# ---- the cache is what attention reads --------------------------------------------------------

def test_identity_cache_matches_mlx_lm_and_attention_reads_it(tiny):
    ids = _ids()
    reference = _mlx_lm_logits(tiny, ids)
    kept, cache = _kvbench_logits(tiny, Keep, ids)
    np.testing.assert_allclose(kept, reference, atol=1e-6, rtol=0)
    assert cache.retained_tokens() == [40, 40]
    assert [layer.offset for layer in cache.layers] == [40, 40]
    assert [a.shape for a in cache.layers[0].state] == [(1, 2, 40, 16)] * 2  # what mx.eval needs
    kv_bytes = 2 * 2 * tiny.num_kv_heads * tiny.head_dim * 40 * 4  # K+V, 2 layers, float32
    assert cache.accounted_bytes() == cache.measured_bytes() == kv_bytes
    zeroed, _ = _kvbench_logits(tiny, ZeroValues, ids)
    assert np.abs(zeroed - reference).max() > 1e-2


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_tiny_mlx_models_have_the_torch_weights(kind):
    from kvbench.models import load_model

    loaded = load_mlx_model(f"tiny:{kind}")
    assert load_mlx_model(f"tiny:{kind}") is not loaded  # a run shares one; a process does not
    ids = _ids(24)
    with torch.inference_mode():
        expected = load_model(f"tiny:{kind}").model(torch.tensor([ids])).logits[0].numpy()
    got = np.array(loaded.model(mx.array([ids]))[0])
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert loaded.attention == (f"mlx_lm.models.{kind}",)


def test_a_kvbench_method_runs_through_its_mlx_implementation(tiny):
    from kvbench.methods import has_implementation, implementation
    from kvbench.methods.settings.identity import Identity

    if not has_implementation(Identity, "mlx"):
        pytest.skip("identity has no MLX implementation registered yet")
    ids = _ids()
    cache = MLXKVBenchCache(implementation(Identity(), "mlx"), tiny.num_layers)
    np.testing.assert_allclose(_decode_logits(tiny, cache, ids, 10), _mlx_lm_logits(tiny, ids),
                               atol=1e-6, rtol=0)


def test_checks_after_every_call(tiny):
    with pytest.raises(RuntimeError, match="retains 11 tokens after seeing 10"):
        _kvbench_logits(tiny, Overclaims, _ids(12))
    # Dropping inside a multi-token step leaves the shared causal mask the wrong size.
    with pytest.raises(RuntimeError, match="mask was sized for 10"):
        _kvbench_logits(tiny, lambda: DropPrefix(3), _ids(12))


# ---- positions, bias, sparse-V ----------------------------------------------------------------

def test_positions_continue_after_eviction(tiny):
    ids = _ids()
    _, cache = _kvbench_logits(tiny, lambda: DropPrefix(10), ids)
    assert [layer.offset for layer in cache.layers] == [40, 40]
    assert [policy.seen_tokens for policy in cache.policies] == [40, 40]
    assert cache.retained_tokens() == [30, 30]


def test_the_model_adds_the_cache_bias_to_its_attention(tiny):
    ids = _ids()
    plain = _mlx_lm_logits(tiny, ids)
    zero, _ = _kvbench_logits(tiny, lambda: Biased(lambda lead, t: mx.zeros((*lead, t))), ids)
    np.testing.assert_allclose(zero, plain, atol=1e-4, rtol=1e-4)
    # Decode steps that hide the prefill by bias read like a cache that dropped it (which holds
    # only if the dropping cache's RoPE positions continue from every token seen).
    hidden, _ = _kvbench_logits(tiny, lambda: Biased(hide_prefix_after_prefill(10)), ids)
    dropped, _ = _kvbench_logits(tiny, lambda: DropPrefix(10), ids)
    assert np.abs(hidden - plain).max() > 1e-2
    np.testing.assert_allclose(hidden, dropped, atol=1e-4, rtol=1e-4)


def test_positions_from_the_retained_count_would_be_caught(tiny, monkeypatch):
    """The bias-vs-drop comparison fails if offset followed retained tokens instead of seen."""
    ids = _ids()
    hidden, _ = _kvbench_logits(tiny, lambda: Biased(hide_prefix_after_prefill(10)), ids)
    monkeypatch.setattr(mlx_host.MLXPolicyLayer, "offset",
                        property(lambda self: self.policy.retained_tokens if self.started else 0))
    wrong, _ = _kvbench_logits(tiny, lambda: DropPrefix(10), ids)
    assert np.abs(hidden - wrong).max() > 1e-3


def test_sparse_v_inside_the_model(tiny):
    ids = _ids()
    plain = _mlx_lm_logits(tiny, ids)
    fine, _ = _kvbench_logits(tiny, lambda: SparseKeep(1e-30), ids)
    np.testing.assert_allclose(fine, plain, atol=1e-4, rtol=1e-4)

    coarse, cache = _kvbench_logits(tiny, lambda: SparseKeep(0.05), ids)
    counters = cache.counters()
    layers, heads = tiny.num_layers, tiny.model.args.num_attention_heads
    assert counters["sparse_v_steps"] == 30 * layers
    # one row per query head per cached key, summed over the 30 steps (11 .. 40 keys)
    assert counters["sparse_v_rows"] == heads * layers * sum(range(11, 41))
    assert 0 < counters["sparse_v_rows_skipped"] < counters["sparse_v_rows"]
    assert counters["sparse_v_output_error_sum"] > 0
    assert np.abs(coarse - plain).max() > 1e-3


def test_attention_that_ignores_the_bias_is_refused(tiny, monkeypatch):
    import mlx_lm.models.llama as llama

    from kvbench.models.mlx_attention import original_attention

    monkeypatch.setattr(llama, "scaled_dot_product_attention", original_attention(llama))
    with pytest.raises(RuntimeError, match="did not read the kvbench cache"):
        _kvbench_logits(tiny, lambda: SparseKeep(1e-3), _ids(20))


@pytest.mark.parametrize("q_len,t_len", [(1, 9), (7, 7), (3, 10)])
def test_biased_attention_matches_torch_and_mx_fast(q_len, t_len):
    from kvbench.models.attention import biased_attention as torch_biased

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((4, q_len), (2, t_len), (2, t_len)))
    bias = torch.randn(1, 2, t_len, generator=g)
    qm, km, vm, bm = (mx.array(t.numpy()) for t in (q, k, v, bias))
    mask = "causal" if q_len > 1 else None
    plain, _ = biased_attention(qm, km, vm, mask, None, 0.25)
    fast = mx.fast.scaled_dot_product_attention(qm, km, vm, scale=0.25, mask=mask)
    np.testing.assert_allclose(np.array(plain), np.array(fast), atol=1e-5, rtol=1e-5)
    got, _ = biased_attention(qm, km, vm, mask, bm, 0.25)
    expected, _ = torch_biased(q, k, v, None, bias, 0.25)
    np.testing.assert_allclose(np.array(got), expected.numpy(), atol=1e-5, rtol=1e-5)
    if q_len == 1:
        got, sparse = biased_attention(qm, km, vm, None, bm, 0.25, skip_below=0.1)
        expected, expected_sparse = torch_biased(q, k, v, None, bias, 0.25, skip_below=0.1)
        np.testing.assert_allclose(np.array(got), expected.numpy(), atol=1e-5, rtol=1e-5)
        assert sparse[:2] == expected_sparse[:2]
        assert sparse[2] == pytest.approx(expected_sparse[2], rel=1e-3)


# ---- the perplexity pass ----------------------------------------------------------------------

def _mlx_perplexity(loaded, ids, context, method, decode_chunk=1):
    """(ppl, prefill_s, decode_s, cache): the perplexity benchmark's pass on an MLX session."""
    from kvbench.benchmarks.measure.perplexity import _run_lockstep
    from kvbench.benchmarks.specs.perplexity import PerplexityParams
    from kvbench.models.mlx_session import MLXSession

    session = MLXSession(loaded)
    params = PerplexityParams(context=context, continuation=len(ids) - context,
                              decode_chunk=decode_chunk)
    _, result = _run_lockstep(session, ids, params, method, 0, lambda message: None, 0)
    return (result.ppl(len(ids) - context), result.prefill_s, sum(result.segment_s),
            result.cache)


def test_perplexity_pass_reads_through_the_cache(tiny):
    ids = _ids(48)
    reference = _mlx_perplexity(tiny, ids, 32, None)
    kept = _mlx_perplexity(tiny, ids, 32, Policy(Keep))
    chunked = _mlx_perplexity(tiny, ids, 32, Policy(Keep), decode_chunk=4)
    assert kept[0] == pytest.approx(reference[0], rel=1e-6)
    assert chunked[0] == pytest.approx(reference[0], rel=1e-5)
    assert kept[1] > 0 and kept[2] > 0
    assert kept[3].retained_tokens() == [47, 47]  # the last token is scored, never fed
    zeroed = _mlx_perplexity(tiny, ids, 32, Policy(ZeroValues))
    assert abs(zeroed[0] - reference[0]) > 1e-3 * reference[0]


def test_rope_overrides():
    nested = {"rope_parameters": {"rope_theta": 1e5, "rope_type": "default"}}
    assert rope_overrides(nested) == {"rope_theta": 1e5}
    assert rope_overrides({**nested, "rope_theta": 1e5}) == {}
    scaled = {"rope_theta": 5e5, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}
    assert rope_overrides(scaled) == {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}


# ---- the bundled model: MLX agrees with torch -------------------------------------------------

# Long enough for a wrong RoPE base to show (logits off by ~2 at 15 tokens, more further on).
PROMPT = "The key and value cache of a transformer grows with every token it reads."
LOGITS_AGREE = 1e-2  # torch vs MLX, float32 both: measured ~1e-4


@pytest.fixture(scope="module")
def bundled_pair(bundled):
    return bundled, load_mlx_model(BUNDLED)


@pytest.mark.model
def test_greedy_tokens_agree_with_torch(bundled_pair):
    torch_model, mlx_model = bundled_pair
    assert mlx_model.tokenizer.encode(PROMPT) == torch_model.tokenizer.encode(PROMPT)
    cache = MLXKVBenchCache(Policy(Keep), mlx_model.num_layers)
    same_tokens, logit_diff = _agreement(torch_model, mlx_model.model, cache.layers)
    assert same_tokens and logit_diff < LOGITS_AGREE


@pytest.mark.model
def test_a_config_without_top_level_rope_theta_is_caught(bundled_pair, tmp_path):
    """mlx-lm reads only a top-level rope_theta; without it the model is silently wrong, and the
    agreement test above fails. load_mlx_model passes the nested one through."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model as mlx_lm_load

    from kvbench.models.bundled import bundled_dir

    torch_model, _ = bundled_pair
    folder = bundled_dir(BUNDLED.removeprefix("bundled:"))
    for item in folder.iterdir():
        if item.name != "config.json":
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((folder / "config.json").read_text())
    del config["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps(config))

    plain, _ = mlx_lm_load(tmp_path)  # what mlx-lm does unaided
    same_tokens, logit_diff = _agreement(torch_model, plain, make_prompt_cache(plain))
    # measured 0.8 to 2 depending on where the trajectories part: far above LOGITS_AGREE
    assert logit_diff > 10 * LOGITS_AGREE and not same_tokens

    fixed = load_mlx_model(str(tmp_path), log=lambda message: None)
    same_tokens, logit_diff = _agreement(torch_model, fixed.model, make_prompt_cache(fixed.model),
                                         steps=2)
    assert same_tokens and logit_diff < LOGITS_AGREE


@pytest.mark.model
def test_identity_perplexity_matches_torch(bundled_pair):
    from kvbench.data.text import load_text

    torch_model, mlx_model = bundled_pair
    ids = torch_model.tokenizer.encode(load_text("pydoc", None))[:48]
    expected = _torch_perplexity(torch_model, ids, 40)
    ppl, prefill_s, decode_s, cache = _mlx_perplexity(mlx_model, ids, 40, Policy(Keep))
    assert ppl == pytest.approx(expected, rel=1e-4)
    assert cache.retained_tokens() == [47] * mlx_model.num_layers


# ---- backend helpers --------------------------------------------------------------------------

def test_backend_timers_and_memory():
    mlx_backend.reset_peak_memory()
    result, seconds = mlx_backend.timed(lambda: mx.ones((512, 512)) @ mx.ones((512, 512)))
    assert seconds > 0 and float(result[0, 0].item()) == 512.0
    assert mlx_backend.peak_memory_bytes() >= 512 * 512 * 4
    name, reference = mlx_backend.blas_info()
    assert isinstance(name, str) and isinstance(reference, bool)
    assert name != "unknown" or not reference
