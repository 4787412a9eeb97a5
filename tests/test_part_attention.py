"""Attention over a cache's parts (kvbench.models.part_attention, LayerCachePolicy.attention_parts):
the merged softmax against SDPA and the float reference on fresh random inputs (the bound:
1e-5 of the output's scale in float32), the parts of a packed cache against its whole read, and
a chunked prefill of a quantizer whose reads come in parts against the same prefill read whole."""
from __future__ import annotations

import pytest
import torch

import kvbench.models.attention as attention
from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods import build_method, implementation
from kvbench.models.attention import biased_attention
from kvbench.methods.core.read_parts import READ_PART_BYTES, as_part
from kvbench.models.part_attention import PART_BYTES_MAX, part_attention, part_bytes
from kvbench.models.session import prefill

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BOUND = 1e-5  # of the output's largest magnitude


def _parts(keys, values, sizes):
    """keys and values cut into parts of `sizes` tokens, each a function returning its arrays."""
    parts, start = [], 0
    for size in sizes:
        k, v = keys[..., start : start + size, :], values[..., start : start + size, :]
        parts.append(as_part(k, v))
        start += size
    assert start == keys.shape[-2]
    return parts


def _close(out, reference):
    error = (out.float() - reference.float()).abs().max().item()
    assert error <= BOUND * reference.abs().max().item(), error


@pytest.mark.parametrize("sizes", [[40], [7, 33], [1, 16, 16, 7], [32, 8]])
@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive"])
def test_parts_merged_equal_sdpa_over_the_whole_read(sizes, mask_kind, monkeypatch):
    generator = torch.Generator().manual_seed(len(sizes))
    query = torch.randn(1, 8, 6, 16, generator=generator)  # 4 query heads per KV head
    keys, values = (torch.randn(1, 2, 40, 16, generator=generator) for _ in range(2))
    positions, key_positions = torch.arange(34, 40)[:, None], torch.arange(40)[None]
    causal = positions >= key_positions
    mask = None
    if mask_kind == "bool":  # a random part of what is causal, each query seeing itself
        seen = causal & (torch.rand(6, 40, generator=generator) > 0.3)
        mask = (seen | (positions == key_positions))[None, None]
    elif mask_kind == "additive":
        mask = torch.where(causal, torch.randn(6, 40, generator=generator), -torch.inf)[None, None]
    # blocks of 5 keys inside each part: the merge runs within parts as well as across them
    monkeypatch.setattr("kvbench.models.part_attention.READ_PART_BYTES", 5 * 8 * 6 * 4)
    out = part_attention(query, _parts(keys, values, sizes), mask, 40, scaling=0.3)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=causal if mask is None else mask, scale=0.3,
        enable_gqa=True)
    _close(out, reference)


def test_parts_take_the_models_softcap_and_sinks_as_the_float_reference():
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(1, 4, 3, 8, generator=generator) * 4
    keys, values = (torch.randn(1, 2, 20, 8, generator=generator) for _ in range(2))
    sinks = torch.randn(4, generator=generator)
    out = part_attention(query, _parts(keys, values, [9, 11]), None, 20, softcap=5.0,
                         sinks=sinks)
    reference, _ = biased_attention(query, keys, values, None, None, softcap=5.0, sinks=sinks)
    _close(out, reference)


def test_parts_that_hold_another_count_of_keys_than_the_read_reported_are_refused():
    keys = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="held 4 keys, the read reported 5"):
        part_attention(torch.randn(1, 1, 2, 8), _parts(keys, keys, [4]), None, 5)


def _adaptive_widths(method):
    method.head_bits = [[2, 4]]  # layer 0's two KV heads at two widths, as calibrate() sets
    return method


POLICIES = {
    "intq": ({"bits": 4}, None), "lloydmax": ({"bits": 4}, None),
    "decay": ({"base": "intq", "base_params": {"group_size": 16}, "base_bits": 4, "min_bits": 2,
               "decay_rate": 4.0, "window": 8, "segment": 8}, None),
    "adaptive": ({"base": "intq", "base_params": {"group_size": 8}, "base_bits": 4},
                 _adaptive_widths),
    "sparse_v": ({"base": "intq", "base_params": {"group_size": 16}, "tau": 1e-3}, None),
    # keys per channel in groups of 8 over tokens, chunks of 16; values per token
    "kivi": ({"bits": 2, "group_size": 8, "residual": 16}, None),
}


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("decoded", [False, True])
def test_a_caches_parts_are_its_whole_read_cut_in_order(name, decoded):
    params, prepare = POLICIES[name]
    method = implementation(build_method(name, params))
    cache = (prepare or (lambda m: m))(method).new_layer_cache(0)
    if decoded:
        assert cache.keep_decoded()
    generator = torch.Generator().manual_seed(1)
    for tokens in (40, 33, 25):
        cache.append(*(torch.randn(1, 2, tokens, 64, generator=generator) for _ in range(2)))
    token_bytes = 2 * 2 * 64 * 4
    assert cache.attention_parts(98 * token_bytes) is None  # within the budget: read whole
    parts = cache.attention_parts(16 * token_bytes)
    made = [part.make() for part in parts]
    keys, values, _ = cache.attention_inputs()
    assert torch.equal(torch.cat([k for k, _ in made], -2), keys)
    assert torch.equal(torch.cat([v for _, v in made], -2), values)
    assert [part.tokens for part in parts] == [k.shape[-2] for k, _ in made]
    if not decoded:  # the packed tokens decoded a part of at most 16 tokens at a time
        assert len(parts) > 3 and max(part.tokens for part in parts[:-1]) <= 16


def test_a_codec_caches_sinks_and_tail_are_parts_of_their_own():
    codecs = implementation(build_method("intq", {"bits": 4})).layer_codecs
    cache = CodecCache(*codecs, window=8, ops=TORCH_ARRAYS, sinks=4)
    for tokens in (40, 33, 25):
        cache.append(torch.randn(1, 2, tokens, 64), torch.randn(1, 2, tokens, 64))
    sizes = [part.tokens for part in cache.attention_parts(16 * 2 * 2 * 64 * 4)]
    assert sizes[0] == 4 and sizes[-1] == 8 and sum(sizes) == 98  # the sinks, the window


@pytest.mark.parametrize("name, params", [("intq", {"bits": 4, "window": 8}),
                                          ("kivi", {"group_size": 8, "residual": 16})])
def test_a_quantizers_chunked_prefill_read_in_parts_gives_the_whole_reads_logits(
        tiny_llama, tiny_sessions, monkeypatch, name, params):
    session = tiny_sessions("llama")
    ids = torch.randint(5, 100, (96,), generator=torch.Generator().manual_seed(0)).tolist()
    method = implementation(build_method(name, params))
    read_in_parts = []

    def counted(*args, **kwargs):
        read_in_parts.append(args[0].shape[-2])
        return part_attention(*args, **kwargs)

    monkeypatch.setattr(attention, "part_attention", counted)
    whole, _, _ = prefill(session, session.new_cache(method), ids, method, probe=[], chunk=32)
    assert not read_in_parts
    monkeypatch.setattr("kvbench.models.part_attention.READ_PART_BYTES", 1)
    parted, _, _ = prefill(session, session.new_cache(method), ids, method, probe=[], chunk=32)
    assert read_in_parts and set(read_in_parts) == {32}  # the later chunks, every layer
    _close(parted, whole)


@pytest.mark.parametrize("free, expected", [(2**30, 64 * 2**20), (2**20, READ_PART_BYTES),
                                            (2**40, PART_BYTES_MAX)])
def test_on_cuda_a_part_is_a_sixteenth_of_the_free_memory_within_bounds(monkeypatch, free,
                                                                        expected):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 2 * free))
    assert part_bytes(torch.device("cuda", 0)) == expected
    assert part_bytes(torch.device("cpu")) == READ_PART_BYTES
