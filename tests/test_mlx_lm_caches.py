"""mlx-lm's own KV caches as kvbench methods (kvbench.methods.external.mlx_lm_cache, hosted by
kvbench.models.mlx_host.MLXLibraryLayer) give what mlx-lm's own generate_step gives with the same
caches: the same greedy answer, token for token, on the bundled model, and the same cache state,
bit for bit; their bytes are the arrays mlx-lm's caches hold; bad settings are blamed at their
field. Skipped, naming the install line, without the mlx extra.

Both sides feed the same forwards. generate_step prefills all of the prompt but its last token
in forwards of prefill_step_size (2048) tokens, then feeds the last token as the step whose
logits give the first answer token, then one token a step, and it feeds the last answer token
too (it computes the next step before yielding). The prompt here is one forward of len - 1
tokens, so kvbench's side is session.prefill(chunk=len - 1), one-token steps, and the last
answer token fed before the states are compared. The split matters to the rotating cache: fed
whole, the prompt's last token would see a sliding window of the prompt, not the first `keep`
tokens and the newest ones.

mlx-lm's side is given its caches as prompt_cache: with kv_bits, generate_step holds a plain
KVCache and converts it after the forward that reaches quantized_kv_start (so the first prompt
forward attends in full precision), which is not a QuantizedKVCache from the first token; and
its max_kv_size is ignored for llama models (their Model.make_cache builds the caches).

The prompt is ~60 tokens: MLX's CPU matmul makes the prefill the cost of these tests.
"""
from __future__ import annotations

import itertools

import pytest

from tests.plugins.extras import require_extra

require_extra("mlx")

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache  # noqa: E402

from kvbench.config.fields import SettingError  # noqa: E402
from kvbench.methods import implementation  # noqa: E402
from kvbench.methods.settings.mlx_lm_cache import MLXLMQuantized, MLXLMRotating  # noqa: E402
from kvbench.models.mlx_host import MLXKVBenchCache, MLXLibraryLayer  # noqa: E402
from kvbench.models.session import prefill  # noqa: E402
from kvbench.suite.errors import SuiteError  # noqa: E402
from kvbench.suite.loader import load_suite  # noqa: E402

PROMPT = ("The lighthouse keeper on Varn Island was named Odile Brask. She kept a ledger of every"
          " ship that passed. The island had no trees, only grass and stones, and the wind came"
          " from the west for most of the year. Every morning, before the gulls woke, Odile")
NEW_TOKENS = 12

# max_size 40 < the prompt: the prompt's forward reads a sliding window, its last token's step
# trims the cache to 40, and every answer token overwrites the oldest after the first 4
CONFIGS = [
    pytest.param(MLXLMQuantized(bits=4, group_size=64), lambda: QuantizedKVCache(64, 4),
                 id="quantized-4"),
    pytest.param(MLXLMQuantized(bits=8, group_size=64), lambda: QuantizedKVCache(64, 8),
                 id="quantized-8", marks=pytest.mark.slow),  # the 4-bit path, other codes
    pytest.param(MLXLMRotating(max_size=40, keep=4),
                 lambda: RotatingKVCache(max_size=40, keep=4), id="rotating-40"),
]


def _mlx_lm_answer(model, ids: list[int], caches: list) -> list[int]:
    steps = generate_step(mx.array(ids), model, max_tokens=NEW_TOKENS, prompt_cache=caches)
    return [token for token, _ in itertools.islice(steps, NEW_TOKENS)]


def _kvbench_answer(session, method, ids: list[int]) -> tuple[list[int], MLXKVBenchCache]:
    """Greedy tokens through kvbench's session, fed as generate_step feeds them (above)."""
    cache = session.new_cache(method)
    logits, _, _ = prefill(session, cache, ids, method, chunk=len(ids) - 1)
    tokens = [int(logits[-1].argmax())]
    for _ in range(NEW_TOKENS):
        logits, _ = session.step(tokens[-1:], cache, last_only=True)
        tokens.append(int(logits[-1].argmax()))
    return tokens[:NEW_TOKENS], cache


def _arrays(cache) -> list[mx.array]:
    """Every array an mlx-lm cache holds, its room ahead included."""
    return [a for _, a in tree_flatten([cache.keys, cache.values])]


@pytest.mark.model
@pytest.mark.parametrize("settings, make", CONFIGS)
def test_the_greedy_answer_and_the_state_are_mlx_lms(bundled_mlx_session, settings, make):
    session = bundled_mlx_session
    model = session.loaded.model
    ids = session.tokenizer.encode(PROMPT)
    theirs = [make() for _ in range(session.num_layers)]
    expected = _mlx_lm_answer(model, ids, theirs)
    ours, cache = _kvbench_answer(session, implementation(settings, "mlx"), ids)
    assert ours == expected
    assert all(isinstance(layer, MLXLibraryLayer) for layer in cache.layers)
    for policy, their in zip(cache.policies, theirs, strict=True):
        assert policy.seen_tokens == their.offset == len(ids) + NEW_TOKENS
        mine = _arrays(policy.cache)
        assert [a.shape for a in mine] == [a.shape for a in _arrays(their)]
        assert all(mx.array_equal(a, b).item() for a, b in zip(mine, _arrays(their)))
        assert policy.measured_bytes() == their.nbytes
        assert policy.retained_bytes == sum(a.nbytes for _, a in
                                            tree_flatten(their.keys_and_values()))
    if isinstance(settings, MLXLMRotating):
        assert cache.retained_tokens() == [40] * session.num_layers


# ---- bytes, tokens and the layer mlx-lm's attention sees, on random keys and values -----------

def _feed(policy, tokens: int, seed: int) -> None:
    keys, values = (mx.random.normal((1, 2, tokens, 64), key=mx.random.key(seed + i))
                    for i in range(2))
    policy.append(keys, values)


def _check_counts(policy) -> None:
    """Accounted: the tokens attention reads, in every array; measured: the arrays whole."""
    cache = policy.cache
    read = [a for _, a in tree_flatten(cache.keys_and_values())]
    assert policy.seen_tokens == cache.offset
    assert policy.retained_tokens == read[0].shape[-2]
    assert policy.retained_bytes == sum(a.nbytes for a in read)
    assert policy.measured_bytes() == sum(a.nbytes for a in _arrays(cache)) == cache.nbytes


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_bytes_are_its_codes_scales_and_biases(bits):
    policy = implementation(MLXLMQuantized(bits=bits), "mlx").new_layer_cache(0)
    _feed(policy, 250, seed=0)
    for step in range(10):  # past 256 tokens: mlx-lm makes room for 256 more
        _feed(policy, 1, seed=10 + 2 * step)
        _check_counts(policy)
    # per token, head and K or V: 64 values at `bits` bits, one float32 scale and bias
    assert policy.retained_bytes == 2 * 2 * 260 * (64 * bits // 8 + 2 * 4)
    assert policy.measured_bytes() == policy.retained_bytes * 512 // 260
    assert policy.trim(6) == 6 and policy.seen_tokens == policy.retained_tokens == 254


def test_rotating_bytes_are_the_tokens_it_holds():
    policy = implementation(MLXLMRotating(max_size=40), "mlx").new_layer_cache(0)
    _feed(policy, 30, seed=0)
    _check_counts(policy)
    assert policy.retained_tokens == 30
    held = []
    for step in range(12):  # fills to 40, then overwrites in place
        _feed(policy, 1, seed=10 + 2 * step)
        _check_counts(policy)
        held.append(policy.retained_tokens)
    assert held == [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 40, 40]
    _feed(policy, 5, seed=50)  # a forward of 5 reads the 39 before it and its own
    _check_counts(policy)
    assert policy.retained_tokens == 44 and policy.seen_tokens == 47


def test_the_layer_mlx_lms_attention_sees_is_the_caches():
    quantized = MLXKVBenchCache(implementation(MLXLMQuantized(bits=4), "mlx"), 2)
    layer = quantized.layers[0]
    assert (layer.bits, layer.group_size) == (4, 64)  # mlx-lm's quantized attention path
    rotating = MLXKVBenchCache(implementation(MLXLMRotating(max_size=8), "mlx"), 2).layers[0]
    assert not hasattr(rotating, "bits")
    keys = mx.zeros((1, 2, 12, 64))
    rotating.update_and_fetch(keys, keys)
    assert rotating.offset == 12
    window = rotating.make_mask(3)  # the cache's sliding window of 8, not kvbench's causal mask
    assert window.shape == (3, 10) and window.sum().item() == 3 * 8


# ---- settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, params, blamed, message", [
    (MLXLMQuantized, {"bits": 7}, "bits", "bits must be 1, 2, 3, 4, 5, 6 or 8"),
    (MLXLMQuantized, {"group_size": 16}, "group_size", "group_size must be 32, 64 or 128"),
    (MLXLMQuantized, {"prefill_reads": "exact"}, "prefill_reads", "must be stored"),
    (MLXLMRotating, {"max_size": 0}, "max_size", "max_size must be >= 1"),
    (MLXLMRotating, {"max_size": 8, "keep": 8}, "keep", "no room is left to rotate"),
])
def test_bad_settings_are_blamed_at_their_field(cls, params, blamed, message):
    with pytest.raises(SettingError, match=message) as refused:
        cls(**params)
    assert refused.value.fields == (blamed,)


@pytest.mark.parametrize("params, head_dim, blamed, message", [
    ({"group_size": 128}, 64, "group_size", "group_size 128 does not divide head_dim 64"),
    # mlx-lm's QuantizedKVCache makes room for head_dim // (32 // bits) words: 21, not 20
    ({"bits": 5}, 128, "bits", "take 20 uint32 words, but .* makes room for 21"),
])
def test_a_head_dim_the_cache_cannot_hold_is_blamed(params, head_dim, blamed, message):
    settings = MLXLMQuantized(**params)
    with pytest.raises(SettingError, match=message) as refused:
        settings.check_head_dim(head_dim)
    assert refused.value.fields == (blamed,)
    MLXLMQuantized(bits=5).check_head_dim(64)  # 10 words either way


def test_a_suite_on_a_model_the_cache_cannot_hold_is_refused_at_the_field(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "kvbench: 1\nname: s\ndefaults: {model: 'tiny:llama', backend: mlx}\n"
        "methods:\n  - name: mlx-lm-quantized\n    params:\n      group_size: 32\n"
        "benchmarks:\n  - kind: quality\n")
    with pytest.raises(SuiteError) as refused:
        load_suite(suite)
    (issue,) = refused.value.issues
    assert (issue.key, issue.line) == ("methods[0].params.group_size", 7)
    assert "does not divide head_dim 16" in issue.message
