"""The decoded-once read path (LayerCachePolicy.keep_decoded; KVBenchCache and its MLX twin with
decoded_reads=True): the same attention inputs as the packed path, bit for bit, at every step
(merges of packed chunks, trims, multi-token appends, the window spilling into packed blocks,
decay's requantization and eviction), the same accounted bytes, and each packed chunk decoded
once instead of the whole packed cache at every read.

Bit-identity rests on the codecs that declare themselves chunk separable
(kvbench.methods.core.contracts.Codec.chunk_separable): decode(merge(parts)) equals the
concatenation of decode(part). The first test checks that claim for every codec that makes it; a
policy whose codecs do not make it (turbo's Haar rotation and QJL, lloydmax with rotation: matrix
products) keeps the packed path and says so (keep_decoded() is False, the cache's decoded_reads
False).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.kernels.formats import IntQFormat
from kvbench.methods import METHODS, has_implementation, implementation
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.core.decay_cache import DecayCache
from kvbench.methods.core.kivi_cache import KiviCache
from kvbench.methods.settings import MethodSettings, build_method
from kvbench.methods.torch.intq import IntQCodec
from tests.plugins.extras import method_extra_missing

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- the cases: every registered method's conformance settings, and a few that reach more ------

def _with_widths(method: Implementation) -> Implementation:
    """adaptive with its tiny-model widths set as calibrate() would (2 layers, 2 KV heads)."""
    method.head_bits = [[2, 4], [4, 8]]
    return method


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    settings: Callable[[], MethodSettings]
    prepare: Callable[[Implementation], Implementation] = lambda method: method

    def build(self, backend: str = "torch") -> Implementation:
        """The case's method as `backend` implements it."""
        return self.prepare(implementation(self.settings(), backend))


def _conformance_cases() -> list[Case]:
    cases = []
    for name in METHODS.names():
        cls = METHODS.get(name)
        # test_conformance says it skipped them; the cases here run on torch
        if method_extra_missing(cls) or not has_implementation(cls, "torch"):
            continue
        for params in cls.conformance_params:
            cases.append(Case(f"{name}{params}",
                              lambda cls=cls, params=params: cls(**params)))
    return cases


EXTRA = [
    # channel groups of 2 at 2 bits are half a byte: packed chunks cannot merge and stay apart
    Case("intq-unmerged", lambda: build_method(
        "intq", {"axis": "channel", "group_size": 2, "bits": 2, "window": 3})),
    Case("kivi-4bit", lambda: build_method("kivi", {"bits": 4, "group_size": 4, "residual": 8})),
    # decay_rate 4: segments are requantized to 2 bits and evicted within the run
    Case("decay-intq-evicting", lambda: build_method(
        "decay", {"base": "intq", "base_params": {"group_size": 16}, "base_bits": 4,
                  "min_bits": 2, "decay_rate": 4.0, "window": 8, "segment": 8})),
    Case("adaptive-intq", lambda: build_method(
        "adaptive", {"base": "intq", "base_params": {"group_size": 8}, "base_bits": 4}),
        _with_widths),
    Case("sparse_v-intq", lambda: build_method(
        "sparse_v", {"base": "intq", "base_params": {"group_size": 16}, "tau": 1e-3})),
]
CASES = _conformance_cases() + EXTRA


def _offers(case: Case) -> bool:
    return case.build().new_layer_cache(0).keep_decoded()


OFFERING = [case for case in CASES if _offers(case)]


def test_the_codec_methods_take_the_path_and_the_others_do_not():
    taken = {case.id for case in OFFERING}
    for expected in ("intq{'group_size': 16}", "kivi{}", "lloydmax{}", "identity{'dtype': "
                     "'float16'}", "decay-intq-evicting", "adaptive-intq", "sparse_v-intq",
                     "turbo3{'block': 16}",
                     "decay{'base_params': {'block': 16}, 'window': 8, 'segment': 8}"):
        assert expected in taken
    # no packing (identity "auto"), token eviction and compaction, block summaries: nothing to
    # decode; turbo with Haar or QJL and rotated lloydmax: matrix products in decode, not chunk
    # separable
    for refused in ("identity{}", "streamingllm{'ratio': 0.5}", "snapkv{'ratio': 0.5, 'window': 8}",
                    "h2o{'ratio': 0.5}", "am{'ratio': 0.5}", "butterfly{'block_size': 8, 'window': 8}",
                    "turbo3{'block': 16, 'bits': 4, 'qjl': True, 'window': 8}",
                    "turbo3{'block': 16, 'rotation': 'haar', 'codebook': 'beta'}",
                    "lloydmax{'rotate': True, 'window': 8}",
                    "sparse_v{}"):
        assert refused in {case.id for case in CASES}
        assert refused not in taken


def test_keep_decoded_after_an_append_is_refused():
    policy = implementation(build_method("intq", {"group_size": 16})).new_layer_cache(0)
    policy.append(torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16))
    with pytest.raises(RuntimeError, match="before the first append"):
        policy.keep_decoded()


# ---- the codecs that claim chunk separability keep it -----------------------------------------

def _codecs(method) -> list:
    found = [method.key_codec(), method.value_codec()]
    settings = method.settings
    if hasattr(settings, "variant"):  # decay and adaptive: the base at each of their widths
        for bits in settings.widths():
            variant = implementation(settings.variant(bits))
            found += [variant.key_codec(), variant.value_codec()]
    return [c for c in found if c is not None]


def _separable_codecs():
    seen, out = set(), []
    for case in CASES:
        for codec in _codecs(case.build()):
            key = (type(codec).__name__, codec.layout(), codec.token_block)
            if codec.chunk_separable and key not in seen:
                seen.add(key)
                out.append(pytest.param(codec, id=f"{case.id}:{codec.layout()}"))
    return out


@pytest.mark.parametrize("codec", _separable_codecs())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_separable_codec_decodes_merged_chunks_as_the_chunks(codec, dtype):
    g = torch.Generator().manual_seed(5)
    block = codec.token_block
    merged, decoded = None, []
    for size in (7, 1, 1, 3, 1, 40, 2, 1):
        part = codec.encode((torch.randn(1, 3, size * block, 16, generator=g) * 4).to(dtype))
        decoded.append(codec.decode(part))
        merged = part if merged is None else codec.merge([merged, part])
        if merged is None:  # this layout cannot merge: the caches keep the chunks apart
            return
        assert torch.equal(codec.decode(merged), torch.cat(decoded, dim=-2))


# ---- one policy, driven by random appends, trims and end_prefill ---------------------------------

def _drive(policies, put, get, dtype, seed=0):
    """Feed both policies the same appends and trims; compare what they hand attention after
    every call. Returns how many reads were compared."""
    g = torch.Generator().manual_seed(seed)
    plan = [("append", 37), ("trim", 2), ("append", 5), ("end", 0)]
    plan += [("append", 1)] * 20 + [("trim", 1), ("append", 6), ("append", 1), ("trim", 3)]
    plan += [("append", 1)] * 12 + [("append", 17)] + [("append", 1)] * 5
    reads = 0
    for op, n in plan:
        if op == "append":
            keys = (torch.randn(1, 2, n, 16, generator=g) * 3).to(dtype)
            values = (torch.randn(1, 2, n, 16, generator=g) * 3).to(dtype)
            for policy in policies:
                policy.append(put(keys), put(values))
        elif op == "trim":
            dropped = [policy.trim(n) for policy in policies]
            assert dropped[0] == dropped[1]
        else:
            for policy in policies:
                policy.end_prefill()
        packed, decoded = policies
        for a, b in zip(packed.attention_inputs(), decoded.attention_inputs()):
            assert (a is None) == (b is None)
            if a is not None:
                a, b = get(a), get(b)
                assert a.dtype == b.dtype and torch.equal(a, b)
        assert packed.retained_tokens == decoded.retained_tokens
        assert packed.seen_tokens == decoded.seen_tokens
        assert packed.retained_bytes == decoded.retained_bytes
        assert packed.counters() == decoded.counters()
        assert decoded.measured_bytes() >= packed.measured_bytes()
        reads += 1
    return reads


@pytest.mark.parametrize("case", OFFERING, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_policy_reads_what_the_packed_path_reads(case, dtype):
    method = case.build()
    packed, decoded = method.new_layer_cache(0), method.new_layer_cache(0)
    assert decoded.keep_decoded()
    _drive((packed, decoded), lambda x: x, lambda x: x, dtype)


def _mlx_port_offering(case: Case) -> Implementation:
    """The case's MLX port, which offers the decoded-once path unless one of its codecs decodes
    by matrix products (then the test skips, saying so)."""
    if not has_implementation(type(case.settings()), "mlx"):
        pytest.skip(f"{case.id} has no MLX implementation")
    port = case.build("mlx")
    if not port.new_layer_cache(0).keep_decoded():
        assert not all(codec.chunk_separable for codec in _codecs(port))
        pytest.skip(f"{case.id}: its MLX codec decodes by matrix products (not chunk separable)")
    return port


@pytest.mark.parametrize("case", OFFERING, ids=lambda c: c.id)
def test_an_mlx_policy_reads_what_its_packed_path_reads(case):
    pytest.importorskip("mlx.core")
    from kvbench.backends.mlx_arrays import MLXArrays

    port = _mlx_port_offering(case)
    packed, decoded = port.new_layer_cache(0), port.new_layer_cache(0)
    assert decoded.keep_decoded()
    arrays = MLXArrays()
    _drive((packed, decoded), arrays.from_torch, arrays.to_torch, torch.float32)


# ---- each packed chunk is decoded once --------------------------------------------------------

class CountingIntQ(IntQCodec):
    def __init__(self, bits, group_size, axis):
        super().__init__(IntQFormat(bits, group_size, axis))
        self.encodes = self.decodes = self.decoded_tokens = 0

    def encode(self, x):
        self.encodes += 1
        return super().encode(x)

    def decode(self, packed):
        self.decodes += 1
        self.decoded_tokens += packed.shape[-2]
        return super().decode(packed)


@pytest.fixture(autouse=True)
def reference_reads(monkeypatch):
    """The packed path read by the reference (decode, then SDPA), as these tests compare it bit
    for bit with the decoded-once path; the CPU fused attention rounds otherwise
    (tests/test_cpu_attention.py checks it)."""
    monkeypatch.setattr("kvbench.methods.torch.base.numba_installed", lambda: False)


def _run(policy, steps: int, prompt: int = 100):
    g = torch.Generator().manual_seed(1)
    policy.append(torch.randn(1, 2, prompt, 16, generator=g), torch.randn(1, 2, prompt, 16, generator=g))
    policy.end_prefill()
    policy.attention_inputs()
    for _ in range(steps):
        policy.append(torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g))
        policy.attention_inputs()
    return policy


@pytest.mark.parametrize("axis, group, window", [("token", 16, 0), ("channel", 16, 8)])
def test_codec_cache_decodes_each_pack_once(axis, group, window):
    steps = 64

    def cache(decoded):
        policy = CodecCache(CountingIntQ(4, group, axis), CountingIntQ(4, group, axis), window,
                            TORCH_ARRAYS)
        if decoded:
            assert policy.keep_decoded()
        return _run(policy, steps)

    fast, slow = cache(True), cache(False)
    packed_tokens = fast.retained_tokens - fast._raw_k.shape[-2]
    for codec in (fast.key_codec, fast.value_codec):
        assert codec.decodes == codec.encodes  # one decode per chunk packed, none per read
        assert codec.decoded_tokens == packed_tokens  # every packed token decoded exactly once
    if axis == "channel":
        assert fast.key_codec.decodes <= 2 + steps // group  # packs, not reads
    # the packed path decodes the whole packed cache at every one of the steps + 1 reads
    assert slow.key_codec.decodes == steps + 1
    assert slow.key_codec.decoded_tokens > (steps + 1) * 64


def test_kivi_and_decay_decode_each_pack_once():
    steps = 48
    kivi = KiviCache(CountingIntQ(2, 8, "channel"), CountingIntQ(2, 8, "token"), 16, 8,
                     TORCH_ARRAYS)
    assert kivi.keep_decoded()
    _run(kivi, steps)
    for codec in (kivi.keys.codec, kivi.values.codec):
        assert codec.decodes == codec.encodes
        assert codec.decoded_tokens < 2 * (100 + steps)

    method = build_method("decay", {"base": "intq", "base_params": {"group_size": 16},
                                    "base_bits": 4, "min_bits": 2, "decay_rate": 4.0,
                                    "window": 8, "segment": 8})
    codecs = {bits: (CountingIntQ(bits, 16, "token"), CountingIntQ(bits, 16, "token"))
              for bits in method.widths()}
    decay = DecayCache(method, codecs.__getitem__, TORCH_ARRAYS)
    assert decay.keep_decoded()
    _run(decay, steps)
    assert decay.tokens_requantized and decay.tokens_evicted
    for pair in codecs.values():
        for codec in pair:
            # one decode for each encode (ours), one for each requantization (the method's own)
            assert codec.decodes <= 2 * codec.encodes + 2 * steps // 8


# ---- inside the model: the same logits at every step ------------------------------------------

PROMPT, FIRST_STEPS, CHUNK, LAST_STEPS = 150, 12, 5, 4


def _token_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _session_run(session, method, ids, decoded_reads):
    """Prefill (probe and end_prefill as the benchmarks do), one-token steps, one multi-token
    step (where the method supports it), one-token steps: (every step's logits, accounted bytes
    after each step, the cache)."""
    from kvbench.models.session import prefill

    cache = session.new_cache(method, decoded_reads=decoded_reads)
    logits = [prefill(session, cache, ids[:PROMPT], method)[0]]
    accounted = [cache.accounted_bytes()]
    at = PROMPT
    chunks = [1] * FIRST_STEPS + ([CHUNK] if method.supports().decode_chunk else [])
    for n in chunks + [1] * LAST_STEPS:
        logits.append(session.step(ids[at:at + n], cache)[0])
        accounted.append(cache.accounted_bytes())
        at += n
    return logits, accounted, cache


def _compare(session, case: Case, vocab: int, backend: str = "torch"):
    ids = _token_ids(PROMPT + FIRST_STEPS + CHUNK + LAST_STEPS, vocab)
    packed_logits, packed_bytes, packed = _session_run(session, case.build(backend), ids, False)
    logits, accounted, cache = _session_run(session, case.build(backend), ids, True)
    assert not packed.decoded_reads
    assert cache.decoded_reads
    assert len(logits) == len(packed_logits)
    for step, (a, b) in enumerate(zip(packed_logits, logits)):
        assert torch.equal(a, b), f"step {step}: logits differ by {(a - b).abs().max():g}"
    assert accounted == packed_bytes
    assert cache.measured_bytes() > packed.measured_bytes()  # the decoded copy is counted
    return cache


@pytest.fixture(scope="module")
def torch_session(tiny_llama):
    from kvbench.models.session import TorchSession

    return TorchSession(tiny_llama, torch.device("cpu"))


@pytest.mark.parametrize("case", OFFERING, ids=lambda c: c.id)
def test_the_tiny_model_gives_the_same_logits_on_both_paths(torch_session, case):
    _compare(torch_session, case, vocab=260)


@pytest.mark.parametrize("name, params", [("identity", {}), ("streamingllm", {"ratio": 0.5}),
                                          ("turbo3", {"block": 16, "qjl": True})])
def test_a_cache_without_the_path_says_so(torch_session, name, params):
    assert not torch_session.new_cache(implementation(build_method(name, params)),
                                       decoded_reads=True).decoded_reads
    # the plain cache takes the keyword and ignores it
    assert torch_session.new_cache(None, decoded_reads=True) is not None


@pytest.fixture(scope="module")
def mlx_session():
    pytest.importorskip("mlx.core")
    from kvbench.models.mlx_loading import load_mlx_model
    from kvbench.models.mlx_session import MLXSession

    return MLXSession(load_mlx_model("tiny:llama"))


@pytest.mark.parametrize("case", OFFERING, ids=lambda c: c.id)
def test_the_tiny_mlx_model_gives_the_same_logits_on_both_paths(mlx_session, case):
    _mlx_port_offering(case)
    _compare(mlx_session, case, vocab=260, backend="mlx")


def test_an_mlx_cache_without_the_path_says_so(mlx_session):
    for name, params in [("identity", {}), ("turbo3", {"block": 16})]:
        assert not mlx_session.new_cache(implementation(build_method(name, params), "mlx"),
                                         decoded_reads=True).decoded_reads


@pytest.mark.slow
@pytest.mark.model
def test_the_bundled_model_gives_the_same_logits_on_both_paths(bundled):
    from kvbench.models.session import TorchSession

    session = TorchSession(bundled, torch.device("cpu"))
    for case in (Case("intq-4bit", lambda: build_method("intq", {"bits": 4})),
                 Case("kivi", lambda: build_method("kivi", {"group_size": 32, "residual": 32})),
                 Case("turbo3", lambda: build_method("turbo3", {"block": 64}))):
        _compare(session, case, vocab=bundled.model.config.vocab_size)


@pytest.mark.parametrize("window, decoded", [(0, False), (0, True), (5, False), (5, True)])
def test_the_codec_cache_builds_an_exact_read_as_the_host_would(window, decoded):
    """attention_inputs_exact (one concat) equals attention_inputs() with the step's tokens
    replaced (what the host does for any other policy), bit for bit, for steps that fall in
    the raw tail, in a packed chunk, or across both."""
    g = torch.Generator().manual_seed(7)
    cache = CodecCache(IntQCodec(IntQFormat(4, 16, "token")), IntQCodec(IntQFormat(4, 16, "token")),
                       window, TORCH_ARRAYS)
    if decoded:
        assert cache.keep_decoded()
    for steps in (37, 1, 3, 8, 1):
        keys, values = (torch.randn(1, 2, steps, 16, generator=g) for _ in range(2))
        cache.append(keys, values)
        stored_keys, stored_values, _ = cache.attention_inputs()
        exact_keys, exact_values, bias = cache.attention_inputs_exact(keys, values)
        assert bias is None
        assert torch.equal(exact_keys, torch.cat([stored_keys[..., :-steps, :], keys], dim=-2))
        assert torch.equal(exact_values,
                           torch.cat([stored_values[..., :-steps, :], values], dim=-2))
        assert not torch.equal(stored_keys[..., -steps:, :], keys) or cache.holds_exactly(steps)
