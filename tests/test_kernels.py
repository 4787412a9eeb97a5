"""The Triton kernels against their torch references (kvbench.kernels).

Codec kernels must write the reference's bytes exactly (codes, norms, scales and mins) and decode
to exactly its values; the fused decode attention must match float64 attention over the
reference-decoded K/V within the dtype's rounding. Inputs are fresh random draws per case (seeded
by the case, so a failure reproduces). Without CUDA these run in Triton's interpreter on the CPU
(tests/conftest.py); with CUDA, compiled on the GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from kvbench.kernels import interpreting  # noqa: E402
from kvbench.kernels.formats import KVSegment, token_axis  # noqa: E402
from kvbench.kernels.triton import attention  # noqa: E402
from kvbench.kernels.triton.segments import decode_attention  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.methods.core.contracts import Packed  # noqa: E402
from tests.plugins.tensors import (  # noqa: E402
    ATTENTION_TOLERANCE, cache_read_inputs, decode_attention_inputs, exact_attention,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def one_tile_configuration(monkeypatch):
    """On a GPU the fused attention is autotuned per layout and shape, compiling every
    configuration first; the tests pin one (test_fused_attention_at_32k_on_the_gpu tunes)."""
    if DEVICE.type == "cuda":
        monkeypatch.setattr(attention, "_SPLIT", attention._split)
        monkeypatch.setattr(attention, "_TILE", {"BLOCK_N": 32, "SELECT": False,
                                                 "num_warps": 4, "num_stages": 2})


def _draw(*shape, seed: int, dtype=torch.float32, kind: str = "gaussian") -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    if kind == "outliers":  # a few channels 20x larger, as real keys have
        x[..., :: max(1, shape[-1] // 4)] *= 20
    elif kind == "zeros_and_constants":  # zero vectors, constant groups, tiny and huge values
        x[..., ::3, :] = 0
        x[..., 1::3, :] = 1.5
        x[..., 2::6, :] *= 1e-30
        x[..., 5::6, :] *= 1e4
    return x.to(dtype).to(DEVICE)


def _method(name: str, params: dict | None = None):
    """A method's torch implementation, from its name and settings."""
    return implementation(build_method(name, params))


def _pair(name: str, **params):
    """The same method run by the torch reference and by the kernels."""
    return _method(name, {**params, "impl": "torch"}), _method(name, {**params, "impl": "triton"})


def _assert_same_packed(ref: Packed, got: Packed) -> None:
    assert ref.tensors.keys() == got.tensors.keys()
    for key in ref.tensors:
        a, b = ref.tensors[key], got.tensors[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), f"{key}: {(a != b).sum().item()} of {a.numel()} differ"
    assert (ref.shape, ref.dtype) == (got.shape, got.dtype)


def _check_codec(reference, kernel, x: torch.Tensor) -> None:
    """Encodes alike to the byte, decodes alike to the bit, and each path reads the other's."""
    for ref_codec, kernel_codec in ((reference.key_codec(), kernel.key_codec()),
                                    (reference.value_codec(), kernel.value_codec())):
        ref, got = ref_codec.encode(x), kernel_codec.encode(x)
        _assert_same_packed(ref, got)
        assert ref_codec.nbytes(ref) == kernel_codec.nbytes(got)
        decoded = ref_codec.decode(ref)
        assert torch.equal(kernel_codec.decode(ref), decoded)
        assert torch.equal(ref_codec.decode(got), decoded)
    assert kernel.impl_log.summary() == {"decode": "triton", "encode": "triton"}


INTQ = [(bits, group, axis) for bits in (2, 4, 8) for group in (8, 32) for axis in
        ("token", "channel")]


@pytest.mark.parametrize("bits,group,axis", INTQ)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_intq_bytes_match_the_reference(bits, group, axis, dtype):
    seed = bits * 100 + group + 7 * (axis == "channel") + 1000 * DTYPES.index(dtype)
    for shape in ((1, 2, 37, 64), (2, 3, 70, 24)):  # odd token counts, a partial group
        x = _draw(*shape, seed=seed, dtype=dtype)
        _check_codec(*_pair("intq", bits=bits, group_size=group, axis=axis), x)


def test_kivi_runs_both_axes_on_the_kernels():
    x = _draw(1, 2, 64, 64, seed=5, dtype=torch.bfloat16)
    _check_codec(*_pair("kivi", bits=2, group_size=32, residual=32), x)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("dim", [8, 24, 64, 80, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lloydmax_bytes_match_the_reference(bits, dim, dtype):
    x = _draw(2, 3, 37, dim, seed=bits * 1000 + dim, dtype=dtype)
    _check_codec(*_pair("lloydmax", bits=bits), x)


TURBO = [("turbo2", {"block": 32}), ("turbo3", {}), ("turbo3", {"block": 8}),
         ("turbo4", {"block": 64}), ("turbo4", {"codebook": "llamacpp"}),
         ("turbo", {"bits": 3, "block": 16, "norm_correction": False}),
         ("turbo", {"bits": 2, "block": 64, "codebook": "beta"})]


@pytest.mark.parametrize("name,params", TURBO, ids=[f"{n}-{p}" for n, p in TURBO])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_turbo_bytes_match_the_reference(name, params, dtype):
    x = _draw(2, 3, 37, 128, seed=len(str(params)) * 7 + len(name), dtype=dtype)
    _check_codec(*_pair(name, **params), x)


# turbo's fp16 norm of the 1e4-scaled vectors overflows to inf on both paths alike
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("kind", ["outliers", "zeros_and_constants"])
@pytest.mark.parametrize("name,params", [("intq", {"bits": 4}), ("intq", {"bits": 2,
                                                                          "axis": "channel"}),
                                         ("lloydmax", {}), ("turbo3", {"block": 64})])
def test_hard_inputs_match_too(kind, name, params):
    """Zero vectors, constant groups (scale 0), subnormal-small and large values, outliers."""
    x = _draw(1, 2, 48, 64, seed=11, dtype=torch.float32, kind=kind)
    _check_codec(*_pair(name, **params), x)


def test_turbo_decode_after_merge_matches():
    """A cache merges packed chunks; the kernels decode the merged layout as the reference."""
    reference, kernel = _pair("turbo3", block=64)
    parts = [kernel.codec().encode(_draw(1, 2, n, 64, seed=n)) for n in (5, 1, 17)]
    merged = kernel.codec().merge(parts)
    assert torch.equal(kernel.codec().decode(merged), reference.codec().decode(merged))


# ---- impl: which path runs ----------------------------------------------------------------------

def test_auto_runs_the_reference_off_cuda_and_the_kernels_on_it():
    method = _method("turbo3", {"block": 64})  # impl auto
    method.codec().encode(_draw(1, 1, 4, 64, seed=1))
    expected = "triton" if DEVICE.type == "cuda" else "torch"
    assert method.impl_log.summary() == {"encode": expected}


def test_triton_on_cpu_outside_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    codec = _method("intq", {"impl": "triton"}).codec()
    with pytest.raises(RuntimeError, match="CUDA tensors.*TRITON_INTERPRET=1"):
        codec.encode(torch.randn(1, 1, 4, 64))


@pytest.mark.parametrize("name,params,reason", [
    ("lloydmax", {"rotate": True}, "rotate"),
    ("turbo3", {"qjl": True, "bits": 3}, "qjl"),
    ("turbo2.5", {}, "outlier_fraction"),
    ("turbo3", {"rotation": "haar"}, "haar"),
    ("intq", {"group_size": 12}, "power of two"),
])
def test_triton_for_a_layout_without_kernels_is_refused(name, params, reason):
    with pytest.raises(ValueError, match=f"impl 'triton': no kernel.*{reason}"):
        build_method(name, {**params, "impl": "triton"})
    # auto quietly takes the reference for the same layout
    method = _method(name, params)
    method.key_codec().encode(_draw(1, 1, 32, 128, seed=2))
    assert method.impl_log.summary() == {"encode": "torch"}


def test_a_suite_asking_for_kernels_a_layout_lacks_is_refused_at_its_line(tmp_path):
    from kvbench.suite.loader import SuiteError, load_suite

    suite = tmp_path / "bad.yaml"
    suite.write_text("kvbench: 1\nmethods:\n  - name: lloydmax\n"
                     "    params: {rotate: true, impl: triton}\n"
                     "benchmarks:\n  - kind: speed\n    params: {n_vectors: 64}\n")
    with pytest.raises(SuiteError) as refused:
        load_suite(suite)
    issue = refused.value.issues[0]
    assert (issue.line, issue.key) == (4, "methods[0].params.rotate")  # what has no kernel
    assert "impl 'triton': no kernel for this layout (rotate" in issue.message


@pytest.mark.skipif(DEVICE.type == "cuda", reason="this machine has CUDA")
def test_the_cuda_suite_is_refused_without_cuda():
    from tests.plugins.cli_support import invoke
    from tests.plugins.suites import ROOT

    result = invoke("run", ROOT / "suites" / "cuda.yaml", "--dry-run")
    assert result.exit_code == 0  # it is a valid suite
    result = invoke("run", ROOT / "suites" / "cuda.yaml")
    assert result.exit_code == 2
    assert "device 'cuda' asked for, but torch sees no CUDA device" in result.output


def test_runs_record_which_implementation_ran(tmp_path):
    """The speed and decode_attention benchmarks on the kernels (interpreted here), through the
    runner: results say what ran, and the fused attention's error is within float32 rounding."""
    from kvbench import load_suite, run_suite

    suite = tmp_path / "kernels.yaml"
    suite.write_text(f"""kvbench: 1
defaults: {{device: {DEVICE.type}}}
methods:
  - {{name: turbo3, params: {{block: 32, impl: triton}}}}
  - {{name: intq, params: {{bits: 4, impl: torch}}}}
benchmarks:
  - kind: speed
    params: {{n_vectors: 48, dim: 64, dtype: float32, warmup: 0}}
  - kind: decode_attention
    methods: [turbo3]
    params: {{context: 70, q_heads: 4, kv_heads: 2, head_dim: 64, dtype: float32, warmup: 1}}
""")
    cases = {c.id: c for c in run_suite(load_suite(suite), tmp_path / "out").result.cases}
    assert all(c.status == "ok" for c in cases.values()), [c.error for c in cases.values()]
    assert cases["speed/turbo3"].info["impl"] == {"decode": "triton", "encode": "triton"}
    assert cases["speed/intq"].info["impl"] == {"decode": "torch", "encode": "torch"}
    attention_case = cases["decode_attention/turbo3"]
    assert attention_case.info["impl"] == {"decode": "triton", "decode attention": "triton",
                                           "encode": "triton"}
    assert attention_case.metrics["rel_error"].value < ATTENTION_TOLERANCE[torch.float32]
    # 16-bit K and V of 64 values / K and V in two blocks of 32 3-bit codes + an fp16 norm
    assert attention_case.metrics["compression_ratio"].value == pytest.approx(
        (2 * 64 * 2) / (2 * 2 * (12 + 2)))


def test_an_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="impl: Input should be 'auto', 'torch' or 'triton'"):
        build_method("intq", {"impl": "cuda"})


# ---- fused decode attention ----------------------------------------------------------------------

ATTENTION_METHODS = [("intq", {"bits": 4}), ("intq", {"bits": 2, "group_size": 16}),
                     ("turbo3", {"block": 64}), ("turbo4", {"block": 32}), ("lloydmax", {}),
                     (None, {})]


ATTENTION_SHAPES = {"mha-33": (1, 4, 4, 33, 64), "gqa3-300-batch2": (2, 9, 3, 300, 128),
                    "mqa8-1token": (1, 8, 1, 1, 128)}


def _attention_codecs(name: str | None, params: dict, dim: int) -> tuple:
    """(the kernels' codec, its format for rows of `dim`, the torch reference's codec) of a
    method; Nones for raw K/V (name None)."""
    if name is None:
        return None, None, None
    codec = _method(name, {**params, "impl": "triton"}).codec()
    return (codec, codec.kernel_for(DEVICE, dim),
            _method(name, {**params, "impl": "torch"}).codec())


def _attention_cases():
    """(dtype, shape) of each case; in the interpreter the large shape in 16-bit dtypes is slow
    (~15 s each): the default run reads it in float32, and 16-bit rounding at the small ones."""
    for label, shape in ATTENTION_SHAPES.items():
        for dtype in DTYPES:
            slow = DEVICE.type == "cpu" and shape[3] > 100 and dtype != torch.float32
            yield pytest.param(dtype, shape, id=f"{label}-{dtype}",
                               marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("name,params", ATTENTION_METHODS,
                         ids=[f"{n}-{p}" for n, p in ATTENTION_METHODS])
@pytest.mark.parametrize("dtype,shape", list(_attention_cases()))
def test_fused_attention_matches_attention_over_the_decoded_cache(name, params, dtype, shape):
    codec, fmt, reference = _attention_codecs(name, params, shape[-1])
    query, segments, all_k, all_v, bias = decode_attention_inputs(shape, dtype, codec, fmt,
                                                                  reference, DEVICE)
    scaling = 0.7 * shape[-1] ** -0.5
    for splits in (1, 2, 5):
        for b in (None, bias):
            out = decode_attention(query, segments, bias=b, scaling=scaling, splits=splits)
            assert out.shape == query.shape and out.dtype == dtype
            exact = exact_attention(query, all_k, all_v, b, scaling)
            error = float((out.double() - exact).norm() / exact.norm())
            assert error < ATTENTION_TOLERANCE[dtype], (splits, b is None, error)


def _feature_cases():
    """(dtype, shape) of the softcap, sinks and window cases: float32 at every shape, bfloat16
    at the small one (the interpreter's pace, as _attention_cases)."""
    for label, shape in ATTENTION_SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16)[: 1 if shape[3] > 100 else 2]:
            yield pytest.param(dtype, shape, id=f"{label}-{dtype}")


@pytest.mark.parametrize("name,params", ATTENTION_METHODS,
                         ids=[f"{n}-{p}" for n, p in ATTENTION_METHODS])
@pytest.mark.parametrize("dtype,shape", list(_feature_cases()))
def test_fused_attention_softcap_sinks_and_window(name, params, dtype, shape):
    """Softcap, sinks and a sliding window, alone and together, with and without a bias, over
    the cache as it is read at a step (packed block, raw tail, the step's token): the windows
    lie in the tail (the block not read), start inside the block (within one split or over
    several) or cover everything."""
    codec, fmt, reference = _attention_codecs(name, params, shape[-1])
    query, segments, all_k, all_v, bias = cache_read_inputs(shape, dtype, codec, fmt,
                                                            reference, DEVICE)
    total, scaling = all_k.shape[2], 0.7 * shape[-1] ** -0.5
    sinks = (2 * _draw(shape[1], seed=shape[3]) + 1).to(dtype)
    in_block = shape[3] // 2 + 4  # half the block, the tail and the step
    cases = [dict(softcap=1.5, splits=1), dict(sinks=sinks, splits=2),
             dict(window=in_block, splits=5), dict(window=9, splits=1),
             dict(window=2, splits=2), dict(window=total + 7, softcap=1.5, bias=bias, splits=5),
             dict(window=in_block, softcap=1.5, sinks=sinks, bias=bias, splits=2),
             dict(window=9, softcap=1.5, sinks=sinks, bias=bias, splits=5)]
    for case in cases:
        out = decode_attention(query, segments, scaling=scaling, **case)
        assert out.shape == query.shape and out.dtype == dtype
        exact = exact_attention(query, all_k, all_v, case.get("bias"), scaling,
                                case.get("softcap"), case.get("sinks"), case.get("window"))
        error = float((out.double() - exact).norm() / exact.norm())
        assert error < ATTENTION_TOLERANCE[dtype], ({k: v for k, v in case.items()
                                                      if k not in ("bias", "sinks")}, error)


@triton.jit
def _tanh_kernel(x_ptr, out_ptr, n, N: tl.constexpr):
    at = tl.arange(0, N)
    tl.store(out_ptr + at, attention._tanh(tl.load(x_ptr + at, mask=at < n)), mask=at < n)


def test_the_softcap_tanh_is_within_a_few_ulp():
    x = torch.cat([torch.linspace(-12, 12, 4001), torch.logspace(-8, 0, 95)])
    x = torch.cat([x, -x, torch.tensor([0.0, 0.3, -0.3])]).to(DEVICE)
    out = torch.empty_like(x)
    _tanh_kernel[(1,)](x, out, x.numel(), N=1 << (x.numel() - 1).bit_length())
    exact = torch.tanh(x.double())
    ulp = torch.finfo(torch.float32).eps * exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert float(((out.double() - exact).abs() / ulp).max()) <= 4


def test_fused_attention_refuses_bad_sinks_and_windows():
    query, keys = _draw(1, 6, 64, seed=1), _draw(1, 3, 10, 64, seed=2)
    with pytest.raises(ValueError, match=r"sinks must be \(q_heads,\) = \(6,\), got \(3,\)"):
        decode_attention(query, [KVSegment(keys, keys)], sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="window must be at least 1, got 0"):
        decode_attention(query, [KVSegment(keys, keys)], window=0)


@pytest.mark.parametrize("name,params", ATTENTION_METHODS,
                         ids=[f"{n}-{p}" for n, p in ATTENTION_METHODS])
def test_fused_attention_reads_views_of_bigger_buffers_in_place(name, params, monkeypatch):
    """A cache keeps its packed blocks in preallocated rooms and hands views of their first
    tokens (not contiguous with batch x heads > 1): the kernel gets the views' own memory (no
    copy) and the output is bit for bit that of the same tokens contiguous."""
    shape = (2, 6, 3, 33, 64)
    codec = fmt = None
    if name is not None:
        codec = _method(name, {**params, "impl": "triton"}).codec()
        fmt = codec.kernel_for(DEVICE, shape[-1])
    query, segments, _, _, bias = cache_read_inputs(shape, torch.float32, codec, fmt,
                                                    device=DEVICE)

    def in_room(t, axis):  # t as the first tokens of a buffer with room for 20 more
        size = list(t.shape)
        size[axis] += 20
        room = torch.full(size, 255 if t.dtype == torch.uint8 else float("nan"),
                          dtype=t.dtype, device=t.device)
        view = room.narrow(axis, 0, t.shape[axis])
        view.copy_(t)
        assert not view.is_contiguous()
        return view

    def side_in_room(side, side_fmt):
        if side_fmt is None:
            return in_room(side, -2)
        return {key: in_room(t, token_axis(side_fmt, key)) for key, t in side.items()}

    views = [KVSegment(side_in_room(s.keys, s.key_format), side_in_room(s.values, s.value_format),
                       s.key_format, s.value_format) for s in segments[:2]] + segments[2:]
    pointers = []
    split = attention._SPLIT

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                pointers.extend(a.data_ptr() for a in args if isinstance(a, torch.Tensor))
                return split[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(attention, "_SPLIT", Spy())
    for case in (dict(splits=2), dict(bias=bias, window=40, softcap=2.0, splits=5)):
        got = decode_attention(query, views, **case)
        assert torch.equal(got, decode_attention(query, segments, **case)), case
    for segment in views[:2]:
        for side in (segment.keys, segment.values):
            for t in (side.values() if isinstance(side, dict) else [side]):
                assert t.data_ptr() in pointers


def test_fused_attention_merges_many_splits():
    """More splits than the combine merges at once (attention.COMBINE_CHUNK)."""
    query = _draw(1, 2, 64, seed=7)
    keys, values = _draw(1, 1, 1100, 64, seed=8), _draw(1, 1, 1100, 64, seed=9)
    splits = 2 * attention.COMBINE_CHUNK + 1
    out = decode_attention(query, [KVSegment(keys, values)], splits=splits)
    exact = exact_attention(query, keys, values, None, 64 ** -0.5)
    assert float((out.double() - exact).norm() / exact.norm()) < ATTENTION_TOLERANCE[torch.float32]


def test_fused_attention_reads_4d_queries_and_refuses_bad_shapes():
    query = _draw(1, 6, 1, 64, seed=1)
    keys = _draw(1, 4, 10, 64, seed=2)
    with pytest.raises(ValueError, match="6 query heads do not share 4 KV heads"):
        decode_attention(query, [KVSegment(keys, keys)])
    keys = _draw(1, 3, 10, 64, seed=2)
    out = decode_attention(query, [KVSegment(keys, keys)])
    assert out.shape == (1, 6, 1, 64)
    with pytest.raises(ValueError, match=r"bias must be \(batch, kv_heads, tokens\)"):
        decode_attention(query, [KVSegment(keys, keys)], bias=torch.zeros(1, 3, 9))


def test_kivi_keys_have_no_fused_attention():
    kivi = _method("kivi", {"impl": "triton"})
    fmt = kivi.key_codec().kernel_for(DEVICE, 64)
    assert fmt.attention_unsupported() == "keys quantized per channel over tokens"


# Window 0 with stored reads: under exact reads (the default) the step's own token, packed at
# once, must be read as the model made it, which the fused kernel over packed segments cannot.
@pytest.mark.parametrize("name,params", [
    ("intq", {"bits": 4, "group_size": 8, "prefill_reads": "stored"}),
    ("turbo3", {"block": 16, "prefill_reads": "stored"}),
    ("lloydmax", {"prefill_reads": "stored"}),
    ("intq", {"bits": 4, "group_size": 8, "window": 5})])
def test_a_model_decodes_through_the_fused_attention(name, params):
    """The transformers adapter reads the packed cache with the fused kernel at one-token steps:
    the same logits as the reference path (decode, then SDPA) within float32 rounding."""
    from kvbench.models import load_model
    from kvbench.models.session import TorchSession

    session = TorchSession(load_model("tiny:llama", DEVICE), DEVICE)
    ids = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    logits = {}
    for impl in ("torch", "triton"):
        method = _method(name, {**params, "impl": impl})
        cache = session.new_cache(method)
        session.step(ids[:30], cache)
        logits[impl] = torch.cat([session.step([t], cache)[0] for t in ids[30:]])
        assert method.impl_log.ran["decode attention"] == {impl}
    scale = logits["torch"].abs().max()
    assert (logits["triton"] - logits["torch"]).abs().max() < 1e-5 * scale


def test_exact_reads_of_a_packed_step_read_it_as_given_through_the_fused_attention():
    """Window 0 under exact reads: the step's token is packed as it is appended; the fused
    kernel reads the cache without it and the step's keys and values as the model made them:
    the reference path's logits (decode, the step replaced, then SDPA) within float32 rounding."""
    from kvbench.models import load_model
    from kvbench.models.session import TorchSession

    session = TorchSession(load_model("tiny:llama", DEVICE), DEVICE)
    logits = {}
    for impl in ("torch", "triton"):
        method = _method("intq", {"bits": 4, "group_size": 8, "impl": impl})
        cache = session.new_cache(method)
        session.step(list(range(4, 34)), cache)
        logits[impl] = torch.cat([session.step([t], cache)[0] for t in (5, 9, 40)])
        assert method.impl_log.ran["decode attention"] == {impl}
    scale = logits["torch"].abs().max()
    assert (logits["triton"] - logits["torch"]).abs().max() < 1e-5 * scale


def _compile_for_hopper(*flags: str) -> str:
    """What tests/plugins/kernel_compile.py compiled for sm_90 (PTX and cubin by the ptxas
    triton ships): the GPU compiler accepts what the interpreter runs, no GPU needed."""
    from tests.plugins.suites import ROOT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "tests.plugins.kernel_compile", *flags, "90"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = done.stdout.split()
    for kernel in ("_encode", "_decode", "_split", "_combine"):
        assert kernel in compiled
    return done.stdout


def test_every_kernel_compiles_for_a_gpu():
    """Four attention layouts (plain, intq, lloydmax, turbo3) in the first tile configuration,
    each configuration in turbo3's, bfloat16; float32 in the first; turbo3 with softcap, sinks
    and a window in each dtype; and the batched step's table path (kvbench.kernels.triton.rows,
    _split with FROM_TABLE) in the four layouts, in each dtype, its rows merged by one _combine."""
    tiles = len(attention._tuned().configs)
    compiled = _compile_for_hopper()
    assert compiled.count("_split") == (4 + tiles - 1) + 4 + 2 + 2 * 4
    assert compiled.count("_combine") == (tiles + 1) + 2 + 2  # one per attention call


@pytest.mark.slow
def test_every_kernel_compiles_for_a_gpu_in_every_tile_configuration():
    tiles = len(attention._tuned().configs)
    assert _compile_for_hopper("--every-tile").count("_split") == 4 * tiles + 4 + 2 + 2 * 4


def test_the_interpreter_runs_here_or_the_gpu_does():
    """Which of the two this run checks (the module docstring): a CUDA run must not interpret."""
    assert interpreting() == (DEVICE.type == "cpu")


# ---- GPU only: sizes the interpreter would take minutes over -----------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="no CUDA device")
@pytest.mark.parametrize("name", ["intq", "kivi", "lloydmax", "turbo3", "turbo4"])
def test_a_million_vectors_match_on_the_gpu(name):
    x = _draw(1, 8, 131072, 128, seed=9, dtype=torch.bfloat16)
    _check_codec(*_pair(name), x)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="no CUDA device")
@pytest.mark.parametrize("name", ["intq", "turbo3", "lloydmax"])
def test_fused_attention_at_32k_on_the_gpu(name, monkeypatch):
    monkeypatch.setattr(attention, "_SPLIT", attention._tuned())  # as it runs outside tests
    monkeypatch.setattr(attention, "_TILE", {})
    query = _draw(1, 32, 128, seed=1, dtype=torch.bfloat16)
    keys = _draw(1, 8, 32768, 128, seed=2, dtype=torch.bfloat16)
    values = _draw(1, 8, 32768, 128, seed=3, dtype=torch.bfloat16)
    codec = _method(name, {"impl": "triton"}).codec()
    pk, pv = codec.encode(keys), codec.encode(values)
    fmt = codec.kernel_for(DEVICE, 128)
    out = decode_attention(query, [KVSegment(pk.tensors, pv.tensors, fmt, fmt)])
    exact = exact_attention(query, codec.decode(pk), codec.decode(pv), None, 128 ** -0.5)
    assert float((out.double() - exact).norm() / exact.norm()) < ATTENTION_TOLERANCE[torch.bfloat16]
