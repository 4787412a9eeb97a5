"""transformers' quantized caches as a kvbench method (kvbench.methods.external.hf_quantized)
give what transformers' own generate() gives with the same cache: the same greedy answer, token
for token, on the bundled model; and their bytes are the tensors the library's layers hold.
Backends whose extra is absent are skipped, naming it."""
from __future__ import annotations

import weakref

import pytest
import torch
import transformers
from transformers import cache_utils

from kvbench.config.fields import SettingError
from kvbench.methods import build_method, implementation
from kvbench.methods.external.hf_quantized import stored_bytes
from kvbench.methods.settings.hf_quantized import HFQuantized
from kvbench.models.session import prefill
from tests.plugins.extras import needs

pytestmark = pytest.mark.model

PROMPT = ("The lighthouse keeper on Varn Island was named Odile Brask. She kept a ledger of every"
          " ship that passed. The island had no trees, only grass and stones, and the wind came"
          " from the west for most of the year. Every morning, before the gulls woke, Odile")
NEW_TOKENS = 16

HAS_FP8 = pytest.mark.skipif(not hasattr(cache_utils, "Fp8QuantizedLayer"),
                             reason=f"transformers {transformers.__version__} has no"
                             " Fp8QuantizedLayer (5.3 and later have)")

# residual_length 8 < NEW_TOKENS: the layers re-quantize while answering (their flush), so the
# answer reads tokens quantized twice, as generate's does
CONFIGS = [
    pytest.param({"backend": "quanto", "nbits": 4, "residual_length": 8}, marks=needs("quanto"),
                 id="quanto-4"),
    pytest.param({"backend": "quanto", "nbits": 2, "residual_length": 8, "q_group_size": 32},
                 marks=needs("quanto"), id="quanto-2"),
    pytest.param({"backend": "hqq", "nbits": 4, "residual_length": 8}, marks=needs("hqq"),
                 id="hqq-4"),
    pytest.param({"backend": "fp8"}, marks=HAS_FP8, id="fp8"),
]


@torch.inference_mode()
def _generate(model, ids: list[int], settings: HFQuantized) -> tuple[list[int], object]:
    config = {"backend": settings.backend, **settings.layer_kwargs()}
    out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                         cache_implementation="quantized", cache_config=config,
                         return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(ids):].tolist(), out.past_key_values


@torch.inference_mode()
def _kvbench_answer(session, method, ids: list[int], chunk: int = 0) -> tuple[list[int], object]:
    """Greedy tokens through kvbench's session: the prompt in one forward (or in forwards of
    `chunk` tokens), then one token a step, as generate() feeds them (every answer token but
    the last is fed back)."""
    cache = session.new_cache(method)
    logits, _, _ = prefill(session, cache, ids, method, chunk=chunk)
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < NEW_TOKENS:
        logits, _ = session.step([tokens[-1]], cache, last_only=True)
        tokens.append(int(logits[-1].argmax()))
    return tokens, cache


@pytest.mark.parametrize("chunk", [0, 16], ids=["one-forward", "chunks-of-16"])
@pytest.mark.parametrize("params", CONFIGS)
def test_greedy_answer_is_generates_token_for_token(bundled, bundled_session, params, chunk):
    """Prefilled in chunks too: the prompt is quantized once, whole, as generate's one forward
    quantizes it (chunk by chunk, every flush would quantize the tokens held again)."""
    settings = build_method("hf-quantized", params)
    ids = bundled.tokenizer(PROMPT).input_ids
    assert len(ids) > 2 * 16
    theirs, their_cache = _generate(bundled.model, ids, settings)
    ours, cache = _kvbench_answer(bundled_session, implementation(settings), ids, chunk)
    assert ours == theirs
    # no layer keeps its full-precision read between steps: attention held it while it read
    assert all(policy.read is None for policy in cache.policies)
    # the same state: every layer's quantized codes and residual equal generate's cache's
    total = len(ids) + NEW_TOKENS - 1
    for policy, layer in zip(cache.policies, their_cache.layers):
        assert policy.seen_tokens == layer.cumulative_length == total
        assert policy.retained_bytes == stored_bytes([layer._quantized_keys,
                                                      layer._quantized_values,
                                                      *policy.residual()])
        assert torch.equal(policy.layer._dequantize(policy.layer._quantized_keys),
                           layer._dequantize(layer._quantized_keys))


@needs("quanto")
def test_bytes_are_the_packed_codes_scales_and_shifts_plus_the_residual(bundled_session):
    settings = build_method("hf-quantized", {"backend": "quanto", "nbits": 4,
                                             "residual_length": 8})
    policy = implementation(settings).new_layer_cache(0)
    heads, dim, prompt, steps = 3, 64, 40, 5
    policy.append(torch.randn(1, heads, prompt, dim), torch.randn(1, heads, prompt, dim))
    policy.end_prefill()
    for _ in range(steps):
        policy.append(torch.randn(1, heads, 1, dim), torch.randn(1, heads, 1, dim))
    # 4-bit codes two to a byte, one float32 scale and shift per group of 64 values, for keys
    # and values; the 5 newest tokens still in float32
    groups = heads * prompt * dim // 64
    assert policy.retained_bytes == 2 * (groups * 64 // 2 + 2 * groups * 4) \
        + 2 * heads * steps * dim * 4
    assert policy.seen_tokens == policy.retained_tokens == prompt + steps


@needs("quanto")
def test_the_last_read_is_released_before_the_layer_dequantizes_again():
    settings = build_method("hf-quantized", {"backend": "quanto", "residual_length": 8})
    policy = implementation(settings).new_layer_cache(0)
    policy.append(torch.randn(1, 2, 40, 64), torch.randn(1, 2, 40, 64))
    policy.end_prefill()
    last_read = weakref.ref(policy.attention_inputs()[0])
    update, alive_at_update = policy.layer.update, []

    def watched_update(keys, values):
        alive_at_update.append(last_read() is not None)
        return update(keys, values)

    policy.layer.update = watched_update
    policy.append(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64))
    assert alive_at_update == [False]
    assert policy.attention_inputs()[0].shape[-2] == 41


@pytest.mark.parametrize("params, blamed, message", [
    pytest.param({"backend": "quanto", "nbits": 3}, "nbits", "has to be one of",
                 marks=needs("quanto")),
    pytest.param({"backend": "quanto", "axis_key": 2}, "axis_key", "has to be one of",
                 marks=needs("quanto")),
    pytest.param({"backend": "fp8", "nbits": 4}, "nbits", "quantizes per tensor", marks=HAS_FP8),
    ({"backend": "hqq", "prefill_reads": "exact"}, "prefill_reads", "must be stored"),
])
def test_bad_settings_are_blamed_at_their_field(params, blamed, message):
    with pytest.raises(SettingError, match=message) as refused:
        HFQuantized(**params)
    assert refused.value.fields == (blamed,)
