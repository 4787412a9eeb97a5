"""Every MLX implementation (kvbench.methods.mlx) against its torch reference, on fresh random
inputs: the same stored tensors (names, shapes, dtypes, so the same byte counts), the same codes
where both backends run the same float32 operations in the same order, stated tolerances where a
float reduction runs in another order, and the same cache behaviour.

Tolerances (each assertion below names the one it uses):
- CODE_AGREEMENT: lloydmax and turbo codes depend on float32 reductions that the backends order
  differently (the vector norm; torch's BLAS against MLX's matmul for the rotation and the QJL
  projection), so a coordinate within a few float32 ulps of a cell boundary (or a projection
  within a few ulps of 0, for the QJL signs) can land on the other side on one backend.
  At least 99.9% of codes must agree; seen: none of 8.8 million differ at these sizes over 10
  seeds, about 1 in 40,000 on larger inputs (2 x 4 x 300 x 128).
- NORM32_RTOL: float32 norms of vectors whose codes agree: sums of <= 128 products in another
  order differ by a few ulps (2^-24 each); 1e-5 relative leaves room for ~100 ulps.
- NORM16_RTOL: fp16 norms of blocks whose codes agree: the float32 values differ by a few ulps, so
  their fp16 rounding may differ by one fp16 ulp, 2^-10 relative (plus the float32 slack).
- DECODE_RTOL: decoding the *same* stored tensors (torch's Packed fed to MLX's decode): only the
  order of the matmul sums differs (rotations, QJL matrix), so float32 outputs agree to 1e-5 of
  the tensor's largest magnitude (seen: <= 1.2e-6); outputs in a 16-bit dtype to one ulp of that
  dtype more.
- ROW_RTOL: encode-then-decode on each backend, token rows whose codes all agree: one fp16 norm
  may be one fp16 ulp apart (9.8e-4 relative, twice with QJL's residual norm), so 2e-3 of the
  row's largest magnitude. Rows with a flipped code must be no more than the flipped codes, and
  the whole round trip's squared error against the input within 1% of torch's.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core")

from kvbench.backends.mlx_arrays import MLXArrays  # noqa: E402
from kvbench.methods import METHODS, has_implementation, implementation  # noqa: E402
from kvbench.methods.core.codec_cache import CodecCache  # noqa: E402
from kvbench.methods.core.contracts import Implementation, Packed  # noqa: E402
from kvbench.methods.core.kivi_cache import KiviCache  # noqa: E402
from kvbench.methods.mlx import packing as mlx_packing  # noqa: E402
from kvbench.methods.settings.identity import Identity  # noqa: E402
from kvbench.methods.settings.intq import IntQ  # noqa: E402
from kvbench.methods.settings.kivi import Kivi  # noqa: E402
from kvbench.methods.settings.lloydmax import LloydMax  # noqa: E402
from kvbench.methods.settings.turbo import Turbo  # noqa: E402
from kvbench.methods.torch import packing as torch_packing  # noqa: E402

CODE_AGREEMENT = 0.999
NORM32_RTOL = 1e-5
NORM16_RTOL = 2**-10 + 1e-5
DECODE_RTOL = 1e-5
ROW_RTOL = 2e-3
MSE_RTOL = 0.01
ULP16 = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 0.0}

SHAPES = [(1, 2, 40, 64), (1, 2, 33, 128)]
SEEDS = [0, 1, 2]

# The tensors here are tiny: torch's thread pool costs more than it saves (5x on a busy 2-core
# machine). One thread for this module, restored after it.
pytestmark = pytest.mark.usefixtures("one_torch_thread", "torch_caches_join")


TO_MX = {torch.float32: mx.float32, torch.float16: mx.float16, torch.bfloat16: mx.bfloat16,
         torch.uint8: mx.uint8}


# --- conversions --------------------------------------------------------------------------------

def on_mlx(settings):
    """`settings` as MLX runs it."""
    return implementation(settings, "mlx")


def on_torch(settings):
    """`settings` as the torch reference runs it."""
    return implementation(settings, "torch")


def is_mlx_cache(cache, cls) -> bool:
    """`cache` is a `cls` (the layer cache every backend shares) holding mx.arrays."""
    return isinstance(cache, cls) and isinstance(cache.ops, MLXArrays)

# The benchmarks' own conversions (bfloat16 through float32, which holds it exactly)
to_mx, to_torch = MLXArrays().from_torch, MLXArrays().to_torch


def packed_to_mx(p: Packed) -> Packed:
    return Packed({k: to_mx(v) for k, v in p.tensors.items()}, p.shape, TO_MX[p.dtype], p.meta)


def inputs(shape, seed, dtype=torch.float32) -> torch.Tensor:
    """Fresh Gaussian keys with a few outlier channels (as real keys have), in `dtype`."""
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(*shape, generator=g) * 2
    x[..., torch.randint(0, shape[-1], (3,), generator=g)] *= 8
    x[..., 3, :] = 0  # a zero vector: the codecs' divide-by-zero guards
    return x.to(dtype)


# --- the method matrix --------------------------------------------------------------------------

def _turbo_cases():
    cases = []
    for name in ("turbo2", "turbo2.5", "turbo3", "turbo3.5", "turbo4"):
        for block in (32, 64, 128):
            for rotation in ("haar", "hadamard"):
                cases.append((name, {"block": block, "rotation": rotation}))
            cases.append((name, {"block": block, "qjl": True}))
    return cases + [
        ("turbo2.5", {"block": 64, "rotation": "haar", "qjl": True}),
        ("turbo4", {"codebook": "llamacpp"}),
        ("turbo3", {"block": 64, "codebook": "beta"}),
        ("turbo3", {"block": 64, "norm_correction": False}),
        ("turbo3", {"block": 64, "outlier_fraction": 0.25}),  # rotated split
        ("turbo3.5", {"block": 32, "outlier_channels": (5, 0, 17, 9, 30, 2, 11, 23, 8, 14,
                                                         1, 27, 19, 4, 12, 31)}),
    ]


CODEC_CASES = (
    [("identity", {"dtype": d}) for d in ("auto", "float16", "bfloat16", "float32")]
    + [("intq", {"bits": b, "axis": a}) for b in (2, 4, 8) for a in ("token", "channel")]
    + [("intq", {"bits": 4, "group_size": 24})]  # partial group of channels
    + [("lloydmax", {"bits": b, "rotate": r}) for b in (2, 3, 4) for r in (False, True)]
    + _turbo_cases()
)
# intq (so kivi) and identity are exact: the same float32 operations in the same order on both
# backends (min and max are order-free; subtract, divide, round-half-even, fp16 and bf16 casts
# are correctly rounded IEEE operations in both; decode multiplies then adds, unfused, in both).
EXACT = {"identity", "intq", "kivi"}


def _case_id(case):
    name, params = case
    return name + "".join(f"-{k}={v}" for k, v in params.items() if k != "outlier_channels") + (
        "-given_channels" if "outlier_channels" in params else "")


def _shapes(settings):
    block = getattr(settings, "block", 1)
    return [s for s in SHAPES if s[-1] % block == 0]


def _code_lengths(torch_codec, shape) -> dict[str, tuple[int, int]]:
    """{stored tensor: (bits, codes per row)} of a codec's packed code tensors."""
    name = type(torch_codec).__name__
    if name == "IntQCodec":
        fmt = torch_codec.format
        return {"codes": (fmt.bits, shape[-1] if fmt.axis == "token"
                          else shape[-2])}
    if name == "LloydMaxCodec":
        return {"codes": (torch_codec.bits, shape[-1])}
    if name == "TurboCodec":
        c = torch_codec
        lengths = {"codes": (c.mse_bits, c.block - c.n_high)}
        if c.n_high:
            lengths["codes_high"] = (c.mse_bits + 1, c.n_high)
        if c.qjl:
            lengths["signs"] = (1, c.block)
        return lengths
    return {}


# --- shared assertions --------------------------------------------------------------------------

def assert_same_layout(pt: Packed, pm: Packed, tc, mc):
    """Same stored tensors: names, shapes, dtypes; so the same bytes, counted by either codec."""
    assert list(pm.tensors) == list(pt.tensors)
    for name, t in pt.tensors.items():
        a = pm.tensors[name]
        assert isinstance(a, mx.array), name
        assert tuple(a.shape) == tuple(t.shape), name
        assert a.dtype == TO_MX[t.dtype], name
    assert tuple(pm.shape) == tuple(pt.shape) and pm.dtype == TO_MX[pt.dtype]
    assert mc.nbytes(pm) == tc.nbytes(pt) > 0
    assert mc.nbytes(pm) == sum(a.nbytes for a in pm.tensors.values())


def compare_codes(pt: Packed, pm: Packed, lengths, exact: bool):
    """Per code tensor the fraction of unpacked codes that agree (checked against the tolerance);
    returns the mask of rows (codes' leading dims) whose codes all agree, and the number of
    codes that differ."""
    mask, flipped = None, 0
    for name, (bits, n) in lengths.items():
        a = torch_packing.unpack_bits(pt.tensors[name], bits, n)
        b = torch_packing.unpack_bits(to_torch(pm.tensors[name]), bits, n)
        same = a == b
        if exact:
            assert torch.equal(pt.tensors[name], to_torch(pm.tensors[name])), name
        else:
            assert same.float().mean() >= CODE_AGREEMENT, (name, same.float().mean())
        flipped += int((~same).sum())
        rows = same.all(-1)
        mask = rows if mask is None else mask & rows
    return mask, flipped


def assert_floats_close(t: torch.Tensor, a, rtol: float, mask=None, what=""):
    """|mlx - torch| <= rtol * |torch| elementwise (where mask, if given)."""
    got, want = to_torch(a).double(), t.double()
    ok = (got - want).abs() <= rtol * want.abs() + 1e-30
    if mask is not None:
        while mask.ndim < ok.ndim:
            mask = mask[..., None]
        ok = ok | ~mask
    assert bool(ok.all()), (what, float(((got - want).abs() / want.abs().clamp_min(1e-30)).max()))


def assert_rows_close(want: torch.Tensor, got: torch.Tensor, rtol: float, mask=None):
    """Each token row (last dim) of `got` within rtol of the row's largest |want| (where mask)."""
    err = (got.double() - want.double()).abs().amax(-1)
    scale = want.double().abs().amax(-1)
    ok = err <= rtol * scale + 1e-30
    if mask is not None:
        ok = ok | ~mask
    assert bool(ok.all()), float((err / scale.clamp_min(1e-30)).max())


# --- registration -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["identity", "intq", "lloydmax", "kivi", "turbo", "turbo2",
                                  "turbo2.5", "turbo3", "turbo3.5", "turbo4"])
def test_every_method_has_an_mlx_implementation_built_from_its_config(name):
    settings = METHODS.get(name)()
    method = on_torch(settings)
    assert has_implementation(type(settings), "mlx")
    port = on_mlx(settings)
    assert isinstance(port, Implementation) and port.settings is settings
    assert port.on.name == "mlx" and type(port).__module__.startswith("kvbench.methods.mlx")
    assert port.layout() == method.layout()
    cache = port.new_layer_cache(0)
    if name == "kivi":
        assert port.codec() is None and is_mlx_cache(cache, KiviCache)
    else:
        assert is_mlx_cache(cache, CodecCache)
        assert port.codec().layout() == method.codec().layout()


# --- packing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", range(1, 9))
def test_packing_is_bit_for_bit_the_torch_layout(bits):
    # Integer shifts, ORs and masks: exact by construction.
    for n in (1, 5, 8, 13, 64, 77, 128):
        g = torch.Generator().manual_seed(bits * 1000 + n)
        codes = torch.randint(0, 1 << bits, (2, 3, n), generator=g).to(torch.uint8)
        packed_t = torch_packing.pack_bits(codes, bits)
        packed_m = mlx_packing.pack_bits(to_mx(codes), bits)
        assert packed_m.dtype == mx.uint8
        assert torch.equal(to_torch(packed_m), packed_t), (bits, n)
        assert torch.equal(to_torch(mlx_packing.unpack_bits(to_mx(packed_t), bits, n)), codes)


def test_packing_refuses_what_torch_refuses():
    with pytest.raises(ValueError):
        mlx_packing.pack_bits(mx.array([1, 2], dtype=mx.int32), 2)
    with pytest.raises(ValueError):
        mlx_packing.pack_bits(mx.array([4], dtype=mx.uint8), 2, check=True)
    with pytest.raises(ValueError):
        mlx_packing.unpack_bits(mx.zeros((3,), dtype=mx.uint8), 3, 9)  # 9 codes need 4 bytes


# --- codecs -------------------------------------------------------------------------------------

def _check_codec(tc, mc, x: torch.Tensor, exact: bool):
    pt = tc.encode(x)
    pm = mc.encode(to_mx(x))
    assert_same_layout(pt, pm, tc, mc)

    lengths = _code_lengths(tc, tuple(x.shape))
    mask, flipped = compare_codes(pt, pm, lengths, exact)
    for name, t in pt.tensors.items():
        if name in lengths:
            continue
        if exact:
            assert torch.equal(to_torch(pm.tensors[name]), t), name
        else:
            rtol = NORM16_RTOL if t.dtype == torch.float16 else NORM32_RTOL
            assert_floats_close(t, pm.tensors[name], rtol, mask, name)

    # Decode of the same stored tensors.
    want = tc.decode(pt)
    got = mc.decode(packed_to_mx(pt))
    assert isinstance(got, mx.array) and got.dtype == TO_MX[x.dtype]
    got = to_torch(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    if exact:
        assert torch.equal(got, want)
    else:
        tol = (DECODE_RTOL + ULP16[x.dtype]) * float(want.abs().max())
        assert float((got.double() - want.double()).abs().max()) <= tol

    # Each backend's own round trip.
    got = to_torch(mc.decode(pm))
    if exact:
        assert torch.equal(got, want)
        return
    rows = None
    if mask is not None:
        rows = mask if mask.ndim == want.ndim - 1 else mask.flatten(want.ndim - 1).all(-1)
        assert int((~rows).sum()) <= flipped
    assert_rows_close(want, got, ROW_RTOL + ULP16[x.dtype], rows)
    err_t = (want.double() - x.double()).pow(2).sum()
    err_m = (got.double() - x.double()).pow(2).sum()
    assert abs(float(err_m / err_t) - 1) <= MSE_RTOL


@pytest.mark.parametrize("case", CODEC_CASES, ids=_case_id)
def test_codec_parity(case):
    name, params = case
    settings = METHODS.get(name)(**params)
    tc, mc = on_torch(settings).codec(), on_mlx(settings).codec()
    assert mc.token_block == tc.token_block
    for shape in _shapes(settings):
        for seed in SEEDS:
            _check_codec(tc, mc, inputs(shape, seed), name in EXACT)


@pytest.mark.parametrize("bits", [2, 4])
def test_kivi_codecs_parity(bits):
    settings = Kivi(bits=bits)
    method, port = on_torch(settings), on_mlx(settings)
    for tc, mc in ((method.key_codec(), port.key_codec()),
                   (method.value_codec(), port.value_codec())):
        assert (mc.format, mc.token_block) == (tc.format, tc.token_block)
        for shape in SHAPES:
            for seed in SEEDS:
                _check_codec(tc, mc, inputs(shape, seed), exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [("intq", {"bits": 4, "axis": "channel"}),
                                  ("lloydmax", {"bits": 3}), ("identity", {"dtype": "float16"}),
                                  ("turbo3", {"block": 64}), ("turbo3.5", {"block": 64})],
                         ids=_case_id)
def test_codec_parity_on_16_bit_inputs(case, dtype):
    name, params = case
    settings = METHODS.get(name)(**params)
    for seed in SEEDS[:2]:
        _check_codec(on_torch(settings).codec(), on_mlx(settings).codec(),
                     inputs(SHAPES[0], seed, dtype),
                     name in EXACT)


def test_a_flipped_code_is_caught():
    """The comparison is not vacuous: one code changed on the MLX side fails it."""
    settings = IntQ(bits=4)
    tc, mc = on_torch(settings).codec(), on_mlx(settings).codec()
    x = inputs(SHAPES[0], 0)
    pt, pm = tc.encode(x), mc.encode(to_mx(x))
    codes = np.array(pm.tensors["codes"])
    codes[0, 0, 0, 0] ^= 1
    pm.tensors["codes"] = mx.array(codes)
    with pytest.raises(AssertionError):
        compare_codes(pt, pm, _code_lengths(tc, SHAPES[0]), exact=True)


def test_merge_parity():
    """Merged parts: the same stored tensors as torch's merge, and None where torch refuses."""
    x = inputs((1, 2, 64, 64), 0)
    parts = [x[..., :32, :], x[..., 32:, :]]
    for settings in (IntQ(bits=2, axis="channel"), IntQ(bits=4), LloydMax(), Turbo(block=64),
                     Identity(dtype="float16")):
        tc, mc = on_torch(settings).codec(), on_mlx(settings).codec()
        mt = tc.merge([tc.encode(p) for p in parts])
        mm = mc.merge([mc.encode(to_mx(p)) for p in parts])
        assert_same_layout(mt, mm, tc, mc)
        exact = type(settings).name in EXACT
        _, flipped = compare_codes(mt, mm, _code_lengths(tc, tuple(x.shape)), exact)
        want, got = tc.decode(mt), to_torch(mc.decode(mm))
        if exact:
            assert torch.equal(got, want)
        elif flipped == 0:
            assert_rows_close(want, got, ROW_RTOL)
    settings = IntQ(bits=2, axis="channel")  # a part of 20 tokens is not whole groups: no merge
    tc, mc = on_torch(settings).codec(), on_mlx(settings).codec()
    parts = [x[..., :20, :], x[..., 20:, :]]
    assert tc.merge([tc.encode(p) for p in parts]) is None
    assert mc.merge([mc.encode(to_mx(p)) for p in parts]) is None


def _boundary_probes(codebook) -> torch.Tensor:
    """float32 values at, just below and just above every boundary, and every centroid."""
    bounds = codebook.boundaries.float()
    up, down = torch.tensor(math.inf), torch.tensor(-math.inf)
    probes = [bounds, torch.nextafter(bounds, up), torch.nextafter(bounds, down),
              torch.nextafter(torch.nextafter(bounds, up), up), codebook.centroids.float(),
              torch.tensor([0.0, -0.0, 1e30, -1e30])]
    return torch.cat(probes)


@pytest.mark.parametrize("density, bits, dim", [("gaussian", b, None) for b in range(1, 9)]
                         + [("gaussian_d", 3, 128), ("beta", 3, 64), ("beta", 2, 32)])
def test_codebook_buckets_match_at_the_boundaries(density, bits, dim):
    """Values exactly on a boundary go to the lower centroid on both backends (torch's float32
    path: boundaries rounded down to float32 where rounding went up, then a strict count)."""
    from kvbench.methods.torch.codebooks import lloyd_max
    from kvbench.methods.mlx.codebooks import MLXCodebook

    codebook = lloyd_max(density, bits, dim)
    x = _boundary_probes(codebook)
    port = MLXCodebook(codebook)
    idx = to_torch(port.quantize(to_mx(x)))
    assert idx.dtype == torch.uint8
    assert torch.equal(idx, codebook.quantize(x))
    assert torch.equal(to_torch(port.dequantize(to_mx(idx))), codebook.dequantize(idx))


def test_llamacpp_codebook_buckets_match_at_the_boundaries():
    from kvbench.methods.mlx.codebooks import MLXCodebook
    from kvbench.methods.torch.turbo import llamacpp_codebook

    codebook = llamacpp_codebook()
    x = _boundary_probes(codebook)
    assert torch.equal(to_torch(MLXCodebook(codebook).quantize(to_mx(x))), codebook.quantize(x))


# --- cache policies -----------------------------------------------------------------------------

CACHE_CASES = [
    (Identity, {}), (Identity, {"dtype": "float16"}),
    (IntQ, {"bits": 4, "window": 8}), (IntQ, {"bits": 2, "axis": "channel"}),
    (LloydMax, {"bits": 3, "rotate": True}),
    (METHODS.get("turbo3"), {"block": 64, "window": 4}),
    (METHODS.get("turbo2.5"), {"block": 64}),
    (METHODS.get("turbo4"), {"block": 32, "qjl": True}),
    (Kivi, {"bits": 2, "group_size": 8, "residual": 16}),
    (Kivi, {"bits": 4, "group_size": 32, "residual": 32}),
    (Kivi, {"bits": 2, "group_size": 8, "residual": 0}),
]


def _packed_tokens(cache) -> tuple[int, ...]:
    """Tokens each stream holds packed: the same rule must pack the same tokens at each step."""
    if isinstance(cache, KiviCache):
        return cache.keys.packed_tokens, cache.values.packed_tokens
    return (cache._packed_tokens,)


def _cache_id(case):
    cls, params = case
    return cls.name + "".join(f"-{k}={v}" for k, v in params.items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CACHE_CASES, ids=_cache_id)
def test_cache_policy_parity(case, dtype):
    cls, params = case
    settings = cls(**params)
    exact = cls.name in EXACT
    torch_cache, mlx_cache = on_torch(settings).new_layer_cache(0), on_mlx(
        settings).new_layer_cache(0)
    assert is_mlx_cache(mlx_cache, KiviCache if isinstance(torch_cache, KiviCache)
                        else CodecCache)
    prefill, steps = 40, 30
    keys = inputs((1, 2, prefill + steps, 64), 7, dtype)
    values = inputs((1, 2, prefill + steps, 64), 8, dtype)
    spans = [(0, prefill)] + [(t, t + 1) for t in range(prefill, prefill + steps)]
    for i, (start, stop) in enumerate(spans):
        for cache in (torch_cache, mlx_cache):
            # clone(): a torch cache may keep the view it is given, and a view of the whole
            # test tensor would count all of its storage in measured_bytes.
            k, v = keys[..., start:stop, :].clone(), values[..., start:stop, :].clone()
            if cache is mlx_cache:
                k, v = to_mx(k), to_mx(v)
            cache.append(k, v)
            if i == 0:
                cache.end_prefill()
        assert mlx_cache.seen_tokens == torch_cache.seen_tokens == stop
        assert mlx_cache.retained_tokens == torch_cache.retained_tokens == stop
        assert mlx_cache.retained_bytes == torch_cache.retained_bytes
        assert mlx_cache.measured_bytes() == torch_cache.measured_bytes()
        assert _packed_tokens(mlx_cache) == _packed_tokens(torch_cache)
        (kt, vt, bt), (km, vm, bm) = torch_cache.attention_inputs(), mlx_cache.attention_inputs()
        assert bt is None and bm is None
        for want, got in ((kt, km), (vt, vm)):
            assert isinstance(got, mx.array) and got.dtype == TO_MX[dtype]
            got = to_torch(got)
            assert got.shape == want.shape == (1, 2, stop, 64)
            if exact:
                assert torch.equal(got, want), (i, stop)
            else:
                # ROW_RTOL (plus one ulp of a 16-bit cache dtype) on every row but those a
                # flipped code spoils (CODE_AGREEMENT: seen none at these sizes): at most 1%.
                err = (got.double() - want.double()).abs().amax(-1)
                bad = err > (ROW_RTOL + ULP16[dtype]) * want.double().abs().amax(-1) + 1e-30
                assert int(bad.sum()) <= max(1, bad.numel() // 100), (i, int(bad.sum()))
    # The quantizing policies did pack: fewer bytes than the raw keys and values.
    if cls is not Identity:
        assert mlx_cache.retained_bytes < 2 * keys.numel() * keys.element_size()
