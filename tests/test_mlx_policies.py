"""The policy methods (sparse_v, decay, adaptive; kvbench.methods.core.wrappers) on MLX against
their torch references, driven by the same appends (a prefill, then one-token steps; decay also a
multi-token decode chunk) on fresh random inputs, compared after every call.

What must be identical on both backends, whatever the base: seen and retained tokens, retained
and measured bytes, counters (sparse-V's totals, decay's tokens_evicted / tokens_requantized,
adaptive's kv_heads_<b>bit), decay's segment widths, adaptive's head groups and bytes per width.
Those follow from the schedule and the stored layouts, not from float arithmetic.

attention_inputs, tolerances as tests/test_mlx_parity.py states them:
- intq, kivi and identity are exact (the same float32 operations in the same order on both
  backends), and so is moving heads around (adaptive): torch.equal.
- turbo: ROW_RTOL = 2e-3 of each token row's largest magnitude (one fp16 norm ulp apart, twice
  with QJL), on all but at most 1% of rows (a code flipped at a cell boundary, CODE_AGREEMENT).
  Under decay a segment is re-encoded from its own decode at each lower width, so a row may have
  been through one encoding per width: the per-row tolerance is ROW_RTOL times the number of
  widths. Seen over these inputs and 6 more seeds: no row outside ROW_RTOL; worst 7.4e-4 (one
  fp16 norm ulp) for adaptive over turbo3/32, 7e-7 for decay over turbo/32, and decay over
  turbo3/64 bit-identical.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core")

from kvbench.backends.mlx_arrays import MLXArrays  # noqa: E402
from kvbench.kernels.formats import IntQFormat  # noqa: E402
from kvbench.methods import has_implementation, implementation  # noqa: E402
from kvbench.methods.core.adaptive_cache import AdaptiveCache  # noqa: E402
from kvbench.methods.core.decay_cache import DecayCache  # noqa: E402
from kvbench.methods.core.sparse_v_cache import SparseVCache  # noqa: E402
from kvbench.methods.core.wrappers import AdaptiveMethod, DecayMethod, SparseVMethod  # noqa: E402
from kvbench.methods.settings import build_method  # noqa: E402
from kvbench.methods.settings.adaptive import Adaptive  # noqa: E402
from kvbench.methods.settings.decay import Decay  # noqa: E402
from kvbench.methods.settings.sparse_v import SparseV  # noqa: E402

ROW_RTOL = 2e-3
BAD_ROW_FRACTION = 0.01
EXACT = {"identity", "intq", "kivi"}
PREFILL, STEPS = 40, 32

# the torch twins join at every step, as MLX caches do (measured bytes compared)
pytestmark = pytest.mark.usefixtures("torch_caches_join")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny tensors: torch's thread pool costs more than it saves on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The benchmarks' own conversions (bfloat16 through float32, which holds it exactly)
to_mx, to_torch = MLXArrays().from_torch, MLXArrays().to_torch


def on_mlx(settings):
    """`settings` as MLX runs it."""
    return implementation(settings, "mlx")


def on_torch(settings):
    """`settings` as the torch reference runs it."""
    return implementation(settings, "torch")


def holds_mlx_arrays(policy) -> bool:
    """The policy keeps mx.arrays (the cache every backend shares, on MLX's arrays); a wrapping
    policy (sparse-V) holds none of its own: its inner policy's are asked."""
    while not hasattr(policy, "ops"):
        policy = policy.inner
    return isinstance(policy.ops, MLXArrays)


def fresh(shape, seed, dtype=torch.float32) -> torch.Tensor:
    """Gaussian keys or values with a few outlier channels and one zero token."""
    g = torch.Generator().manual_seed(5000 + seed)
    x = torch.randn(*shape, generator=g) * 2
    x[..., torch.randint(0, shape[-1], (3,), generator=g)] *= 8
    x[..., 5, :] = 0
    return x.to(dtype)


def spans() -> list[tuple[int, int]]:
    """The prefill, then STEPS one-token steps."""
    return [(0, PREFILL)] + [(t, t + 1) for t in range(PREFILL, PREFILL + STEPS)]


def chunked_spans(chunk: int = 4, every: int = 3, repeats: int = 8) -> list[tuple[int, int]]:
    """The prefill, then `repeats` times `every` one-token steps and a `chunk`-token decode step,
    then one-token steps: STEPS of those in all."""
    out, t = [(0, PREFILL)], PREFILL
    for _ in range(repeats):
        out += [(t + j, t + j + 1) for j in range(every)] + [(t + every, t + every + chunk)]
        t += every + chunk
    return out + [(t + j, t + j + 1) for j in range(STEPS - every * repeats)]


def feed(torch_cache, mlx_cache, keys, values, span, first, queries=None):
    start, stop = span
    for cache in (torch_cache, mlx_cache):
        # clone(): a torch cache may keep the view it is given (its measured bytes would count
        # the whole test tensor's storage)
        k, v = keys[..., start:stop, :].clone(), values[..., start:stop, :].clone()
        q = None if queries is None else queries[..., start:stop, :].clone()
        if cache is mlx_cache:
            k, v = to_mx(k), to_mx(v)
            q = None if q is None else to_mx(q)
        cache.append(k, v, q)
        if first:
            cache.end_prefill()


def assert_same_state(torch_cache, mlx_cache):
    assert mlx_cache.seen_tokens == torch_cache.seen_tokens
    assert mlx_cache.retained_tokens == torch_cache.retained_tokens
    assert mlx_cache.retained_bytes == torch_cache.retained_bytes > 0
    assert mlx_cache.measured_bytes() == torch_cache.measured_bytes()
    assert mlx_cache.counters() == torch_cache.counters()


def assert_same_inputs(torch_cache, mlx_cache, exact: bool, row_rtol: float = ROW_RTOL):
    """attention_inputs agree: bit for bit where exact, else within row_rtol of each row's
    largest magnitude on all but BAD_ROW_FRACTION of the rows. Returns the worst row error."""
    (kt, vt, bt), (km, vm, bm) = torch_cache.attention_inputs(), mlx_cache.attention_inputs()
    assert (bt is None) == (bm is None)
    worst = 0.0
    for want, got in ((kt, km), (vt, vm)):
        assert isinstance(got, mx.array)
        got = to_torch(got)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert want.shape[-2] == torch_cache.retained_tokens
        if exact:
            assert torch.equal(got, want)
            continue
        err = (got.double() - want.double()).abs().amax(-1)
        scale = want.double().abs().amax(-1)
        bad = err > row_rtol * scale + 1e-30
        assert int(bad.sum()) <= max(1, int(bad.numel() * BAD_ROW_FRACTION)), int(bad.sum())
        ok = ~bad
        if ok.any():
            worst = max(worst, float((err[ok] / scale[ok].clamp_min(1e-30)).max()))
    return worst


# --- registration -------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, port_cls, cache_cls", [
    (SparseV(base="turbo3", base_params={"block": 64}, tau=1e-4), SparseVMethod, SparseVCache),
    (Decay(base="intq", base_bits=4, window=8, segment=16), DecayMethod, DecayCache),
    (Adaptive(base="turbo", base_params={"block": 32}), AdaptiveMethod, AdaptiveCache),
], ids=["sparse_v", "decay", "adaptive"])
def test_registered_and_built_from_the_torch_config(settings, port_cls, cache_cls):
    assert has_implementation(type(settings), "mlx")
    port, reference = on_mlx(settings), on_torch(settings)
    assert type(port) is port_cls and port.on.name == "mlx" and port.settings is settings
    assert port.layout() == reference.layout()
    cache = port.new_layer_cache(0)
    assert isinstance(cache, cache_cls) and holds_mlx_arrays(cache)
    # the codecs are the base's MLX codecs (at base_bits), described as torch describes them
    for mine, theirs in ((port.key_codec(), reference.key_codec()),
                         (port.value_codec(), reference.value_codec())):
        assert type(mine).__module__.startswith("kvbench.methods.mlx")
        assert mine.layout() == theirs.layout()


# --- sparse_v -----------------------------------------------------------------------------------

SPARSE_CASES = [  # (base, base_params, attention inputs exact)
    ("turbo3", {"block": 64, "window": 4}, False),
    ("intq", {"bits": 4}, True),
    ("decay", {"base": "kivi", "base_params": {"group_size": 8, "residual": 0}, "base_bits": 4,
               "min_bits": 2, "decay_rate": 4.0, "window": 8, "segment": 8}, True),
]


@pytest.mark.parametrize("base, base_params, exact", SPARSE_CASES,
                         ids=[c[0] for c in SPARSE_CASES])
def test_sparse_v_parity(base, base_params, exact):
    settings = SparseV(base=base, base_params=base_params, tau=1e-4)
    torch_cache, mlx_cache = on_torch(settings).new_layer_cache(0), on_mlx(
        settings).new_layer_cache(0)
    assert isinstance(torch_cache, SparseVCache) and isinstance(mlx_cache, SparseVCache)
    # the inner policy is the base's MLX one, not torch's
    assert type(mlx_cache.inner) is type(on_mlx(settings.base_settings).new_layer_cache(0))
    assert holds_mlx_arrays(mlx_cache.inner) and not holds_mlx_arrays(torch_cache.inner)
    assert mlx_cache.value_skip_threshold == torch_cache.value_skip_threshold == 1e-4
    keys, values = fresh((1, 2, PREFILL + STEPS, 64), 1), fresh((1, 2, PREFILL + STEPS, 64), 2)
    g = np.random.default_rng(3)
    for i, span in enumerate(spans()):
        feed(torch_cache, mlx_cache, keys, values, span, first=i == 0)
        if i:  # what the host's attention reports after a one-token step
            rows = 4 * torch_cache.retained_tokens
            skipped, error = int(g.integers(0, rows)), float(g.random() * 1e-3)
            for cache in (torch_cache, mlx_cache):
                cache.record_sparse_v(skipped, rows, error)
        assert_same_state(torch_cache, mlx_cache)
        assert_same_inputs(torch_cache, mlx_cache, exact)
    counters = mlx_cache.counters()
    assert counters["sparse_v_steps"] == STEPS and counters["sparse_v_rows_skipped"] > 0
    assert counters["sparse_v_output_error_sum"] > 0
    if base == "decay":  # the inner policy's counters come through too
        assert counters["tokens_evicted"] > 0 and counters["tokens_requantized"] > 0


def test_sparse_v_calibrates_its_base_on_the_shared_config():
    """Calibrating through the MLX port calibrates its base (the MLX implementation of the
    settings' own base settings): a refused calibration sets no widths there."""
    settings = SparseV(base="adaptive", base_params={"base": "intq", "base_bits": 4,
                                                     "scale": 1.0})
    port = on_mlx(settings)
    assert port.base.settings is settings.base_settings and port.base.on.name == "mlx"
    with pytest.raises(ValueError, match="at least 16 tokens"):
        port.calibrate(types.SimpleNamespace(spec="tiny:llama"), list(range(10)))
    assert port.base.head_bits is None


# --- decay --------------------------------------------------------------------------------------

DECAY_CASES = [
    ("turbo3", {"block": 64}, 3, 2, 64, torch.float32),
    ("turbo", {"block": 32}, 4, 2, 128, torch.float32),
    ("intq", {}, 4, 2, 64, torch.float32),
    ("intq", {"axis": "channel", "group_size": 8}, 8, 2, 64, torch.bfloat16),
    ("kivi", {"group_size": 8, "residual": 0}, 4, 2, 64, torch.float32),
]


def _decay_id(case):
    base, params, bits, low, dim, dtype = case
    extra = "".join(f"-{k}={v}" for k, v in params.items())
    return f"{base}{extra}-{low}..{bits}bit-d{dim}-{str(dtype).split('.')[-1]}"


@pytest.mark.parametrize("case", DECAY_CASES, ids=_decay_id)
def test_decay_parity(case):
    base, base_params, base_bits, min_bits, dim, dtype = case
    method = Decay(base=base, base_params=base_params, base_bits=base_bits, min_bits=min_bits,
                   decay_rate=4.0, window=8, segment=8 if base == "kivi" else 16)
    port = on_mlx(method)
    torch_cache, mlx_cache = on_torch(method).new_layer_cache(0), port.new_layer_cache(0)
    assert isinstance(torch_cache, DecayCache) and isinstance(mlx_cache, DecayCache)
    assert holds_mlx_arrays(mlx_cache) and not holds_mlx_arrays(torch_cache)
    exact = base in EXACT
    row_rtol = ROW_RTOL * len(method.widths())
    steps = chunked_spans()
    total = steps[-1][1]
    keys, values = fresh((1, 2, total, dim), 11, dtype), fresh((1, 2, total, dim), 12, dtype)

    def due():
        seen = torch_cache.seen_tokens
        return any(method.score(seen - 1 - seg.newest, seen) < method.evict_below
                   for seg in torch_cache.segments)

    worst, widths_seen, held_back, was_held = 0.0, set(), 0, False
    for i, span in enumerate(steps):
        before = (mlx_cache.retained_tokens, mlx_cache.counters()["tokens_evicted"])
        feed(torch_cache, mlx_cache, keys, values, span, first=i == 0)
        assert_same_state(torch_cache, mlx_cache)
        assert mlx_cache.segment_bits() == torch_cache.segment_bits()
        assert ([(s.start, s.tokens) for s in mlx_cache.segments]
                == [(s.start, s.tokens) for s in torch_cache.segments])
        assert mlx_cache.raw_tokens == torch_cache.raw_tokens
        evicted = mlx_cache.counters()["tokens_evicted"]
        if i and span[1] - span[0] > 1:  # a decode chunk: nothing is evicted inside it
            assert (mlx_cache.retained_tokens, evicted) == (before[0] + span[1] - span[0],
                                                           before[1])
            was_held = due()
            held_back += was_held
        else:  # the prefill's end_prefill and one-token steps evict all that is due
            assert not due()
            if was_held:
                assert evicted > before[1]
            was_held = False
        widths_seen.update(mlx_cache.segment_bits())
        worst = max(worst, assert_same_inputs(torch_cache, mlx_cache, exact, row_rtol))
    # the run went through every branch: evictions, requantizations, more than one width
    counters = mlx_cache.counters()
    assert counters["tokens_evicted"] > 0 and counters["tokens_requantized"] > 0
    assert len(widths_seen) > 1 and held_back > 0
    # the raw window is bit-exact on MLX as well
    raw = mlx_cache.raw_tokens
    assert torch.equal(to_torch(mlx_cache.attention_inputs()[0])[..., -raw:, :],
                       keys[..., total - raw:, :])
    assert worst <= row_rtol


def test_decay_uses_the_mlx_codecs_of_the_base_at_each_width():
    method = Decay(base="kivi", base_params={"group_size": 8}, base_bits=4, min_bits=2,
                   segment=16)
    port, reference = on_mlx(method), on_torch(method)
    assert method.widths() == [2, 4]
    for bits in method.widths():
        want = on_mlx(build_method("kivi", {"group_size": 8, "bits": bits}))
        mlx_codecs = port.codecs(bits)
        for mine, theirs, torch_codec, axis in zip(
                mlx_codecs, (want.key_codec(), want.value_codec()), reference.codecs(bits),
                ("channel", "token")):
            assert type(mine) is type(theirs) and mine.layout() == theirs.layout()
            assert mine.format == torch_codec.format == IntQFormat(bits, 8, axis)


# --- adaptive -----------------------------------------------------------------------------------

ADAPTIVE_CASES = [
    # (base, base_params, base_bits, widths per layer for 4 KV heads)
    ("turbo3", {"block": 32}, 3, [[4, 2, 3, 2], [3, 3, 3, 3]]),
    ("intq", {"group_size": 16}, 4, [[8, 2, 4, 2], [2, 4, 2, 8]]),
    ("kivi", {"group_size": 8, "residual": 8}, 4, [[2, 4, 4, 2], [4, 4, 4, 4]]),
]


@pytest.mark.parametrize("base, base_params, base_bits, head_bits", ADAPTIVE_CASES,
                         ids=[c[0] for c in ADAPTIVE_CASES])
def test_adaptive_parity_with_given_widths(base, base_params, base_bits, head_bits):
    settings = Adaptive(base=base, base_params=base_params, base_bits=base_bits)
    method, port = on_torch(settings), on_mlx(settings)
    method.head_bits = port.head_bits = head_bits  # the calibration result, set directly
    kv_heads, per_head, dim = 4, 2, 64
    total = PREFILL + STEPS
    exact = base in EXACT
    for layer, widths in enumerate(head_bits):
        torch_cache, mlx_cache = method.new_layer_cache(layer), port.new_layer_cache(layer)
        assert isinstance(torch_cache, AdaptiveCache) and isinstance(mlx_cache, AdaptiveCache)
        assert holds_mlx_arrays(mlx_cache) and not holds_mlx_arrays(torch_cache)
        keys = fresh((1, kv_heads, total, dim), 20 + layer)
        values = fresh((1, kv_heads, total, dim), 30 + layer)
        queries = fresh((1, kv_heads * per_head, total, dim), 40 + layer)
        for i, span in enumerate(spans()):
            feed(torch_cache, mlx_cache, keys, values, span, i == 0, queries)
            assert mlx_cache.head_bits == torch_cache.head_bits == widths
            assert ([(g.bits, g.heads) for g in mlx_cache.groups]
                    == [(g.bits, g.heads) for g in torch_cache.groups])
            assert mlx_cache.group_bytes() == torch_cache.group_bytes()
            assert_same_state(torch_cache, mlx_cache)
            assert_same_inputs(torch_cache, mlx_cache, exact)
        for g, group in enumerate(mlx_cache.groups):
            # each group's policy is the base's MLX cache at its width
            base_cache = on_mlx(settings.variant(group.bits)).new_layer_cache(layer)
            assert type(group.policy) is type(base_cache) and holds_mlx_arrays(group.policy)
            # a group's queries: the query heads of its KV heads, as torch selects them
            assert torch.equal(to_torch(mlx_cache._select(to_mx(queries), g, per_head)),
                               torch_cache._select(queries, g, per_head))
        # per-head bytes: each head stored alone by the base's MLX cache at its width, summed
        # per width, is what the layer accounts for that width
        per_width: dict[int, int] = {}
        for head, bits in enumerate(widths):
            alone = on_mlx(settings.variant(bits)).new_layer_cache(layer)
            for j, (start, stop) in enumerate(spans()):
                alone.append(to_mx(keys[:, head:head + 1, start:stop].clone()),
                             to_mx(values[:, head:head + 1, start:stop].clone()))
                if j == 0:
                    alone.end_prefill()
            per_width[bits] = per_width.get(bits, 0) + alone.retained_bytes
        assert mlx_cache.group_bytes() == per_width == torch_cache.group_bytes()
        assert mlx_cache.counters() == {f"kv_heads_{b}bit": float(widths.count(b))
                                        for b in sorted(set(widths))}


def test_adaptive_places_every_heads_keys_values_and_bias_as_torch():
    """_place with a bias from one group only: the others get zeros, every head in its place."""
    settings = Adaptive(base="intq", base_bits=4)
    method, port = on_torch(settings), on_mlx(settings)
    method.head_bits = port.head_bits = [[8, 2, 4, 2, 8]]
    torch_cache, mlx_cache = method.new_layer_cache(0), port.new_layer_cache(0)
    x = fresh((1, 5, 6, 16), 50)
    feed(torch_cache, mlx_cache, x, x, (0, 6), first=False)
    g = torch.Generator().manual_seed(51)
    parts_t, parts_m = [], []
    for i, group in enumerate(torch_cache.groups):
        n = len(group.heads)
        k, v = torch.randn(1, n, 6, 16, generator=g), torch.randn(1, n, 6, 16, generator=g)
        b = torch.randn(1, n, 6, generator=g) if i == 1 else None
        parts_t.append((k, v, b))
        parts_m.append((to_mx(k), to_mx(v), None if b is None else to_mx(b)))
    want, got = torch_cache._place(parts_t), mlx_cache._place(parts_m)
    for w, a in zip(want, got):
        assert torch.equal(to_torch(a), w)
    # groups by width: 2 bits (heads 1, 3), 4 (head 2), 8 (heads 0, 4); the 4-bit group alone
    # has a bias, the others zeros
    assert [g.heads for g in torch_cache.groups] == [[1, 3], [2], [0, 4]]
    assert torch.equal(want[2][:, 2], parts_t[1][2][:, 0])
    assert not want[2][:, [0, 1, 3, 4]].any()
    assert torch.equal(want[0][:, [1, 3]], parts_t[0][0]) and torch.equal(want[1][:, 2],
                                                                          parts_t[1][1][:, 0])


def test_a_differing_row_is_caught():
    """The inexact comparison is not vacuous: one row changed on the MLX side fails it."""
    settings = Decay(base="turbo3", base_params={"block": 64}, window=8, segment=16)
    torch_cache, mlx_cache = on_torch(settings).new_layer_cache(0), on_mlx(
        settings).new_layer_cache(0)
    x = fresh((1, 2, 40, 64), 70)
    feed(torch_cache, mlx_cache, x, x, (0, 40), first=True)
    assert_same_inputs(torch_cache, mlx_cache, exact=False)
    keys, values, _ = mlx_cache.attention_inputs()
    spoiled = np.array(keys)
    spoiled[0, :, :2, :] *= 1.01  # 4 rows of 80, more than 1%
    mlx_cache.attention_inputs = lambda: (mx.array(spoiled), values, None)
    with pytest.raises(AssertionError):
        assert_same_inputs(torch_cache, mlx_cache, exact=False)
