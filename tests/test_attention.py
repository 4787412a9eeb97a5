"""kvbench's attention function: SDPA when the cache holds no read for it, a per-key bias and
sparse-V inside the real model when a cache layer asks for them."""
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.methods.core.codec_cache import UNBOUNDED_WINDOW, CodecCache
from kvbench.methods.settings import MethodSettings, implements
from kvbench.methods.settings.identity import Identity
from kvbench.methods.settings.sparse_v import SparseV
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.torch.identity import CastCodec
from kvbench.models.attention import biased_attention
from kvbench.models.tiny import tiny_config
from tests.plugins.model_runs import stepped_logits
from tests.plugins.tensors import token_ids


def _qkv(q_len, t_len, q_heads=4, kv_heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, q_heads, q_len, dim, generator=g),
            torch.randn(1, kv_heads, t_len, dim, generator=g),
            torch.randn(1, kv_heads, t_len, dim, generator=g))


@pytest.mark.parametrize("q_len,t_len", [(1, 9), (7, 7), (3, 10)])
def test_biased_attention_without_bias_is_causal_sdpa(q_len, t_len):
    q, k, v = _qkv(q_len, t_len)
    out, sparse = biased_attention(q, k, v, None, None)
    visible = torch.ones(q_len, t_len, dtype=torch.bool).tril(t_len - q_len)
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                              v.repeat_interleave(2, 1), attn_mask=visible)
    assert sparse is None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_large_negative_bias_removes_keys():
    q, k, v = _qkv(1, 12)
    bias = torch.zeros(1, 2, 12)
    bias[..., :5] = -1e9
    out, _ = biased_attention(q, k, v, None, bias)
    expected, _ = biased_attention(q, k[..., 5:, :], v[..., 5:, :], None, None)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_sparse_v_skips_rows_below_tau_and_reports_them():
    q, k, v = _qkv(1, 64)
    dense, _ = biased_attention(q, k, v, None, None)
    weights = torch.softmax(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 4, dim=-1)
    tau = weights.median().item()
    out, (skipped, rows, error) = biased_attention(q, k, v, None, None, skip_below=tau)
    kept = weights.masked_fill(weights < tau, 0) @ v.repeat_interleave(2, 1)
    assert skipped == (weights < tau).sum().item() and rows == weights.numel()
    torch.testing.assert_close(out, kept, atol=1e-6, rtol=1e-5)
    assert error == pytest.approx(((out - dense).square().sum(-1)
                                   / dense.square().sum(-1)).mean().item(), rel=1e-4)
    assert error > 0


@dataclass
class BiasedIdentity(MethodSettings):
    """Keeps every token; adds `bias_fn(tokens)` to the logits of its keys."""

    bias_fn: Callable = None


@implements(BiasedIdentity)
class _BiasedIdentity(Implementation):
    def new_layer_cache(self, layer_idx):
        return _BiasedCache(self.settings.bias_fn)


class _BiasedCache(CodecCache):
    def __init__(self, bias_fn):
        super().__init__(CastCodec(), CastCodec(), UNBOUNDED_WINDOW, TORCH_ARRAYS)
        self.bias_fn = bias_fn

    def attention_inputs(self):
        keys, values, _ = super().attention_inputs()
        return keys, values, self.bias_fn(keys.shape[:2], keys.shape[-2])


@dataclass
class DropPrefix(MethodSettings):
    """Keeps everything until a token beyond the first `n` arrives, then drops those n."""

    n: int = 0


@implements(DropPrefix)
class _DropPrefix(Implementation):
    def new_layer_cache(self, layer_idx):
        return _DropPrefixCache(self.settings.n)


class _DropPrefixCache(CodecCache):
    def __init__(self, n):
        super().__init__(CastCodec(), CastCodec(), UNBOUNDED_WINDOW, TORCH_ARRAYS)
        self.n, self.seen = n, 0

    def append(self, keys, values, queries=None):
        super().append(keys, values)
        self.seen += keys.shape[-2]
        if self.seen - keys.shape[-2] <= self.n < self.seen:
            for tail in self._tails:
                tail.take_front(self.n)

    @property
    def seen_tokens(self):
        return self.seen


def _decode_logits(model, method, ids, prefill):
    """The logits of the one-token steps after a prefill of `prefill` tokens, (1, steps, vocab)."""
    logits, _ = stepped_logits(model, method, ids, prefill)
    return torch.cat(logits[1:], dim=1)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama.model


def _hide_prefix_after_prefill(n):
    def bias(lead, tokens):
        out = torch.zeros(*lead, tokens)
        if tokens > n:
            out[..., :n] = -1e9
        return out
    return bias


def test_the_model_adds_the_cache_bias_to_its_attention(tiny):
    ids = token_ids(40)
    plain = _decode_logits(tiny, Identity(), ids, 10)
    zero = _decode_logits(tiny, BiasedIdentity(lambda lead, t: torch.zeros(*lead, t)), ids, 10)
    torch.testing.assert_close(zero, plain, atol=1e-4, rtol=1e-4)
    # Decode steps that hide the prefill by bias read like a cache that dropped it.
    hidden = _decode_logits(tiny, BiasedIdentity(_hide_prefix_after_prefill(10)), ids, 10)
    dropped = _decode_logits(tiny, DropPrefix(10), ids, 10)
    assert (hidden - plain).abs().max() > 1e-2
    torch.testing.assert_close(hidden, dropped, atol=1e-4, rtol=1e-4)


def test_sparse_v_inside_the_model(tiny):
    ids = token_ids(40)
    plain = _decode_logits(tiny, Identity(), ids, 10)
    method = SparseV(tau=1e-30)
    cache_logits = _decode_logits(tiny, method, ids, 10)
    torch.testing.assert_close(cache_logits, plain, atol=1e-4, rtol=1e-4)

    steps, cache = stepped_logits(tiny, SparseV(tau=0.05), ids, 10)
    coarse = torch.cat(steps[1:], dim=1)
    counters = cache.counters()
    layers, heads = tiny.config.num_hidden_layers, tiny.config.num_attention_heads
    assert counters["sparse_v_steps"] == 30 * layers
    # one row per query head per cached key, summed over the 30 steps (11 .. 40 keys)
    assert counters["sparse_v_rows"] == heads * layers * sum(range(11, 41))
    assert 0 < counters["sparse_v_rows_skipped"] < counters["sparse_v_rows"]
    assert counters["sparse_v_output_error_sum"] > 0
    assert (coarse - plain).abs().max() > 1e-3


def test_a_model_without_kvbench_attention_is_refused():
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama", "sdpa")
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(RuntimeError, match="did not read the kvbench cache's state of layer 0.*"
                       "load the model with kvbench.models.load_model"):
        _decode_logits(model, SparseV(tau=1e-3), token_ids(20), 10)


def test_sparse_v_refuses_bad_settings():
    with pytest.raises(ValueError, match="tau"):
        SparseV(tau=0)
    with pytest.raises(ValueError, match="base 'nope'"):
        SparseV(base="nope")
    with pytest.raises(ValueError, match="base 'intq'"):
        SparseV(base="intq", base_params={"bits": 3})
