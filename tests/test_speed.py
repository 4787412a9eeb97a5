"""The speed benchmark: structure and correctness only; speed targets are claims in suites."""
import dataclasses
from dataclasses import dataclass

import pytest
import torch

from kvbench.benchmarks import BENCHMARKS, measurement
from kvbench.benchmarks.measure.speed import decode_chunks, decoded_shape, encode_chunks
from kvbench.benchmarks.specs.speed import Speed, SpeedParams, estimate_bytes
from kvbench.config.strict import build_strict
from kvbench.data.synthetic import make_vectors
from kvbench.methods import OnBackend, implementation
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.settings.base import MethodSettings
from kvbench.methods.settings.identity import Identity
from kvbench.reportkit.tables import benchmark_table
from kvbench.results import CaseResult
from kvbench.methods.settings.intq import IntQ
from tests.plugins.model_runs import cpu_context

CTX = cpu_context(repeats=3)
N, DIM = 4096, 128


def _run(method, ctx=CTX, **params):
    """Speed over synthetic vectors; `method` is settings (run as their torch implementation)
    or an implementation."""
    params = {"n_vectors": N, "dim": DIM, "warmup": 0, **params}
    if isinstance(method, MethodSettings):
        method = implementation(method)
    return measurement(Speed).run(SpeedParams(**params), method, ctx)


def _x(n=N, dtype=torch.float16):
    return make_vectors("gaussian", n, DIM, seed=0).reshape(1, 1, n, DIM).to(dtype)


def test_is_registered():
    assert BENCHMARKS.get("speed") is Speed


def test_every_declared_metric_is_reported_with_its_unit():
    out = _run(IntQ(bits=4))
    assert set(out.metrics) == set(Speed.metrics)
    for name, spec in Speed.metrics.items():
        metric = out.metrics[name]
        assert metric.unit == spec.unit and metric.direction == spec.direction, name
        assert metric.timing == spec.timing, name
        if spec.timing:
            assert len(metric.samples) == CTX.repeats and metric.min > 0, name
    assert out.metrics["encode_gb_s"].unit == "GB/s"
    assert out.metrics["encode_vectors_s"].unit == "vectors/s"


def test_a_step_that_does_no_work_is_not_timed():
    """identity at the input's dtype hands its input back: its 'rate' timed nothing (8.9e9
    vectors/s on 2 cores), so it has no rate; cast to another dtype, it does work."""
    same = _run(Identity())
    assert not {name for name in same.metrics if name.startswith(("encode", "decode"))}
    assert same.info["not_timed"] == ["encode", "decode"]
    assert "memcpy_gb_s" in same.metrics and same.metrics["nbytes"].value == N * DIM * 2
    cast = _run(Identity(dtype="float32"))
    assert cast.info["not_timed"] == [] and set(cast.metrics) == set(Speed.metrics)
    # the report reads n/a where a step was not timed
    rows = [CaseResult(id=f"speed/{label}", benchmark="speed", bench_params={},
                       method="identity", method_label=label, method_params={},
                       metrics=out.metrics, info=out.info, status="ok", seed=0)
            for label, out in (("same", same), ("cast", cast))]
    table = benchmark_table(rows, Speed.report.row)
    same_row = next(line for line in table.splitlines() if line.startswith("| same |"))
    assert same_row.count("| n/a") == 6 and "n/a" not in table.replace(same_row, "")


def test_ratios_to_memcpy_are_taken_per_repeat():
    m = _run(IntQ(bits=4)).metrics
    for step in ("encode", "decode"):
        ratios = m[f"{step}_vs_memcpy"].samples
        expected = [a / b for a, b in zip(m[f"{step}_gb_s"].samples, m["memcpy_gb_s"].samples)]
        assert ratios == pytest.approx(expected, rel=1e-12)
    # GB/s and vectors/s come from the same timings: 2 bytes per fp16 value.
    for gb, vectors in zip(m["encode_gb_s"].samples, m["encode_vectors_s"].samples):
        assert gb == pytest.approx(vectors * DIM * 2 / 1e9, rel=1e-12)


def test_bytes_and_ratio():
    m = _run(IntQ(bits=4, group_size=32)).metrics
    per_vector = DIM * 4 // 8 + 4 * (DIM // 32)  # codes + fp16 scale and min per group
    assert m["nbytes"].value == N * per_vector
    assert m["compression_ratio"].value == pytest.approx(2 * DIM / per_vector, rel=1e-12)
    assert _run(Identity()).metrics["compression_ratio"].value == 1.0


def test_info_and_comparable():
    out = _run(IntQ(bits=2), dtype="bfloat16", data_seed=3, warmup=1)
    assert out.info["decoded_shape"] == [1, 1, N, DIM]  # the real decode output, checked
    assert out.info["layout"] == implementation(IntQ(bits=2)).layout()
    assert (out.info["n"], out.info["dim"], out.info["dtype"]) == (N, DIM, "bfloat16")
    assert out.info["torch_threads"] == torch.get_num_threads()
    assert out.comparable == {"data": "gaussian", "shape": f"{N}x{DIM}", "dtype": "bfloat16",
                              "data_seed": "3"}


@pytest.mark.parametrize("chunk", [0, 1500])
def test_identity_round_trip_is_exact(chunk):
    x = _x()
    codec = implementation(Identity()).codec()
    decoded = decode_chunks(codec, encode_chunks(codec, x, chunk))
    assert decoded_shape(decoded) == list(x.shape)
    assert torch.equal(torch.cat(decoded, dim=-2), x)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("chunk", [0, 1500])
def test_intq_round_trip_is_within_half_a_step(bits, chunk):
    x = _x()
    codec = implementation(IntQ(bits=bits, group_size=32)).codec()
    decoded = torch.cat(decode_chunks(codec, encode_chunks(codec, x, chunk)), dim=-2)
    assert decoded.shape == x.shape and decoded.dtype == x.dtype
    groups = x.float().unflatten(-1, (DIM // 32, 32))
    step = (groups.amax(-1) - groups.amin(-1)) / ((1 << bits) - 1)
    error = (decoded.float() - x.float()).unflatten(-1, (DIM // 32, 32)).abs().amax(-1)
    # half a step, plus fp16 rounding of the stored scale/min and of the decoded value
    assert (error <= 0.5 * step * 1.01 + 0.01 * groups.abs().amax(-1)).all()


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_chunked_encode_stores_the_same_bytes(bits):
    method, once = IntQ(bits=bits, group_size=32, axis="token"), dataclasses.replace(CTX, repeats=1)
    whole = _run(method, once).metrics["nbytes"].value
    assert _run(method, once, chunk=1500).metrics["nbytes"].value == whole  # last chunk partial
    assert _run(method, once, chunk=N).metrics["nbytes"].value == whole


def test_chunk_must_hold_whole_token_groups():
    with pytest.raises(ValueError, match="chunk: 1000 is not a multiple .* token block of 32"):
        _run(IntQ(axis="channel", group_size=32), chunk=1000)
    assert _run(IntQ(axis="channel", group_size=32), chunk=1024).info["decoded_shape"][-2] == N


def test_method_without_codec_is_refused():
    @dataclass
    class NoCodecSettings(MethodSettings):
        name = "nocodec"

    class NoCodec(Implementation):
        def new_layer_cache(self, layer_idx):
            raise NotImplementedError

    with pytest.raises(ValueError, match="speed needs a codec method; 'nocodec' has no codec"):
        _run(NoCodec(NoCodecSettings(), OnBackend("torch")))


@pytest.mark.parametrize("field, value", [("n_vectors", 0), ("dim", 0), ("chunk", -1),
                                          ("warmup", -1), ("dtype", "int8"), ("data", "x")])
def test_bad_params_are_refused(field, value):
    # Refused both on the strict build a suite's params go through and on plain construction.
    with pytest.raises(ValueError, match=field):
        build_strict(SpeedParams, {field: value})
    with pytest.raises(ValueError, match=field):
        SpeedParams(**{field: value})


def test_memory_estimate_refuses_what_does_not_fit():
    Speed().check(SpeedParams(), None)  # the default 1M x 128 fits any machine that runs this
    too_big = SpeedParams(n_vectors=10**12)
    with pytest.raises(ValueError, match=r"n_vectors: 1000000000000 x dim 128 .* GB of RAM"):
        Speed().check(too_big, None)
    # chunking bounds the float32 temporaries, not the tensors every run holds
    assert estimate_bytes(SpeedParams(chunk=1000)) < estimate_bytes(SpeedParams())
    assert estimate_bytes(SpeedParams(chunk=1000)) > 6 * 10**6 * 128 * 2


@pytest.mark.parametrize("n", [1, 7, 64])
def test_keys_and_values_go_through_their_own_codecs(n):
    from kvbench.methods.settings.kivi import Kivi

    method = implementation(Kivi(bits=2, group_size=4, residual=8))
    out = measurement(Speed).run(SpeedParams(n_vectors=n, dim=DIM, warmup=0), method, CTX)
    keys, values = n // 2, n - n // 2
    expected = sum(codec.nbytes(codec.encode(torch.zeros(1, 1, t, DIM)))
                   for codec, t in ((method.key_codec(), keys), (method.value_codec(), values)) if t)
    assert out.metrics["nbytes"].value == expected
    assert out.info["decoded_shape"] == [1, 1, n, DIM]
