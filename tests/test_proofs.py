import math
from dataclasses import dataclass

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure.proofs import _cosine
from kvbench.benchmarks.specs.proofs import Proofs, ProofsParams
from kvbench.config.strict import build_strict
from kvbench.data.synthetic import KINDS, make_queries, make_vectors
from kvbench.methods import OnBackend, implementation
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.settings.base import MethodSettings
from kvbench.methods.settings.identity import Identity
from kvbench.methods.settings.intq import IntQ
from kvbench.methods.torch.identity import CastCodec
from tests.plugins.model_runs import cpu_context

CTX = cpu_context(repeats=2)


def _run(method, **params):
    """Proofs over synthetic data; `method` is settings (run as their torch implementation) or
    an implementation."""
    params = {"n_vectors": 512, "dim": 64, **params}
    if isinstance(method, MethodSettings):
        method = implementation(method)
    return measurement(Proofs).run(ProofsParams(**params), method, CTX)


def _values(out):
    return {name: metric.value for name, metric in out.metrics.items()}


# --- synthetic data -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_vectors_are_seeded_float32(kind):
    a = make_vectors(kind, 100, 16, seed=3)
    assert a.shape == (100, 16) and a.dtype == torch.float32
    assert torch.equal(a, make_vectors(kind, 100, 16, seed=3))
    assert not torch.equal(a, make_vectors(kind, 100, 16, seed=4))


def test_kinds_have_their_shape():
    sphere = make_vectors("sphere", 1000, 32, seed=0)
    assert torch.allclose(sphere.norm(dim=-1), torch.ones(1000), atol=1e-6)
    gaussian = make_vectors("gaussian", 20000, 8, seed=0)
    assert abs(float(gaussian.mean())) < 0.02 and abs(float(gaussian.std()) - 1) < 0.02
    spread = make_vectors("outliers", 4000, 64, seed=0).std(dim=0)
    assert int((spread > 10).sum()) == 4 and int((spread < 1.2).sum()) == 60


def test_queries_are_not_the_vectors():
    queries = make_queries(64, 16, seed=0)
    assert queries.shape == (64, 16) and queries.dtype == torch.float32
    assert not torch.equal(queries, make_vectors("gaussian", 64, 16, seed=0))
    assert torch.equal(queries, make_queries(64, 16, seed=0))


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown synthetic data kind 'uniform'"):
        make_vectors("uniform", 4, 4, seed=0)


# --- the benchmark --------------------------------------------------------------------------


def test_identity_is_exact():
    out = _values(_run(Identity()))
    assert out["mse"] == 0.0
    assert out["cosine"] == 1.0
    assert out["compression_ratio"] == 1.0 and out["bits_per_value"] == 16.0
    assert out["ip_rel_error"] == 0.0 and out["attn_output_error"] == 0.0
    assert out["nbytes"] == 2 * 512 * 64 * 2


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_more_bits_are_more_faithful(kind):
    runs = [_values(_run(IntQ(bits=bits), data=kind)) for bits in (8, 4, 2)]
    cosine = [r["cosine"] for r in runs]
    assert 1.0 >= cosine[0] > cosine[1] > cosine[2]
    for lower_is_better in ("mse", "ip_rel_error", "attn_output_error"):
        errors = [r[lower_is_better] for r in runs]
        assert 0 < errors[0] < errors[1] < errors[2], lower_is_better


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("bits, group", [(2, 32), (4, 16), (8, 48)])
def test_ratio_is_the_byte_formula(bits, group, dtype):
    n, dim = 300, 80
    out = _values(_run(IntQ(bits=bits, group_size=group), n_vectors=n, dim=dim, dtype=dtype))
    per_vector = math.ceil(dim * bits / 8) + 4 * math.ceil(dim / group)
    nbytes = 2 * n * per_vector  # K and V
    assert out["nbytes"] == nbytes
    assert out["compression_ratio"] == pytest.approx(2 * n * dim * 2 / nbytes, rel=1e-12)
    assert out["bits_per_value"] == pytest.approx(8 * nbytes / (2 * n * dim), rel=1e-12)


def test_cosine_never_exceeds_one():
    a = torch.randn(1000, 64, dtype=torch.float64)
    for b in (a, a * 3.0, a * 1e-3 + 0.0):
        assert (_cosine(a, b) <= 1.0).all()
    zeros = torch.zeros(2, 4, dtype=torch.float64)
    assert _cosine(zeros, zeros).tolist() == [1.0, 1.0]
    assert _cosine(zeros, torch.ones(2, 4, dtype=torch.float64)).tolist() == [0.0, 0.0]
    for kind in sorted(KINDS):
        for method in (Identity(dtype="bfloat16"), IntQ(bits=8)):
            out = _values(_run(method, data=kind, dtype="float32", n_vectors=128))
            assert 0.999 < out["cosine"] <= 1.0


def test_output_records_layout_shape_hash_and_timings():
    out = _run(IntQ(bits=4), data_seed=1)
    assert out.info["shape"] == [1, 1, 512, 64]
    assert out.info["layout"] == implementation(IntQ(bits=4)).layout()
    sha = out.info["data_sha256"]
    assert sha == _run(Identity(), data_seed=1).info["data_sha256"]
    assert sha != _run(Identity(), data_seed=2).info["data_sha256"]
    assert sha != _run(Identity(), data_seed=1, dtype="float32").info["data_sha256"]
    # comparable names the recipe: runs on CPUs whose float bits differ still compare
    assert out.comparable == {"data": "gaussian", "shape": "512x64", "data_seed": "1"}
    for name in ("encode_ms", "decode_ms"):
        metric = out.metrics[name]
        assert len(metric.samples) == CTX.repeats and metric.min > 0 and metric.unit == "ms"
        assert metric.timing == "absolute"
    for name in ("encode_vs_memcpy", "decode_vs_memcpy"):
        metric = out.metrics[name]
        assert len(metric.samples) == CTX.repeats and metric.timing == "ratio" and metric.min > 0


def test_metric_table_matches_the_output():
    out = _run(IntQ())
    assert set(out.metrics) == set(Proofs.metrics)
    for name, spec in Proofs.metrics.items():
        assert out.metrics[name].direction == spec.direction
        assert out.metrics[name].unit == spec.unit
        assert out.metrics[name].timing == spec.timing
        assert spec.timing == ("absolute" if name.endswith("_ms") else
                               "ratio" if name.endswith("_vs_memcpy") else None)


@pytest.mark.parametrize(
    "field, value",
    [("data", "uniform"), ("n_vectors", 0), ("dim", 0), ("dtype", "int8"), ("tokens", 0),
     ("n_queries", 0), ("layers", []), ("layers", [-1])],
)
def test_invalid_params_name_the_field(field, value):
    # Refused both on the strict build a suite's params go through and on plain construction.
    with pytest.raises(ValueError, match=field):
        build_strict(ProofsParams, {field: value})
    with pytest.raises(ValueError, match=field):
        ProofsParams(**{field: value})


@dataclass
class _Plain(MethodSettings):
    """Settings with no fields, for the hand-written implementations below."""


def test_a_method_without_codec_is_refused():
    class NoCodec(Implementation):
        def new_layer_cache(self, layer_idx):
            raise NotImplementedError

    with pytest.raises(ValueError, match="proofs needs a codec method"):
        _run(NoCodec(_Plain(), OnBackend("torch")))


def test_captured_needs_a_model():
    from kvbench.models.info import ModelInfo

    with pytest.raises(ValueError, match="needs a model"):
        Proofs().check(ProofsParams(data="captured"), None)
    with pytest.raises(ValueError, match="tokens"):
        Proofs().check(ProofsParams(data="captured", tokens=9000), ModelInfo("tiny:x", 8192))
    Proofs().check(ProofsParams(data="gaussian"), None)


@pytest.mark.model
def test_captured_keys_and_values(bundled):
    ctx = cpu_context(loaded=bundled)
    params = ProofsParams(data="captured", layers=[0, 5], tokens=128, dtype="float32")
    proofs = measurement(Proofs)
    exact = _values(proofs.run(params, implementation(Identity()), ctx))
    assert exact["mse"] == 0.0 and exact["cosine"] == 1.0
    out = proofs.run(params, implementation(IntQ(bits=4)), ctx)
    assert out.info["shape"] == [1, 2 * 3, 128, 64]  # two layers of 3 KV heads
    assert 0.9 < out.metrics["cosine"].value < 1.0
    assert out.comparable["layers"] == "0,5" and out.comparable["model"] == bundled.spec
    # the model's own queries, causally masked: identity leaves attention untouched, intq does not
    assert exact["attn_kl"] == 0 and exact["ip_rel_error"] == 0
    assert 0 < out.metrics["attn_kl"].value < 0.1 and math.isfinite(out.metrics["ip_bias"].value)


class _Shrink(Implementation):
    """Keys kept exactly, values scaled by 0.9, or the reverse: K and V codecs differ."""

    def __init__(self, shrink_keys: bool):
        super().__init__(_Plain(), OnBackend("torch"))
        self.shrink_keys = shrink_keys

    def new_layer_cache(self, layer_idx):
        raise NotImplementedError

    def key_codec(self):
        return _ScaleCodec(0.9 if self.shrink_keys else 1.0)

    def value_codec(self):
        return _ScaleCodec(1.0 if self.shrink_keys else 0.9)


class _ScaleCodec(CastCodec):
    def __init__(self, factor):
        super().__init__("float32")
        self.factor = factor

    def decode(self, packed):
        return super().decode(packed) * self.factor


def test_attention_metrics_are_zero_for_identity():
    out = _values(_run(Identity()))
    assert out["ip_bias"] == 0 and out["ip_error_std"] == 0 and out["attn_kl"] == 0


def test_keys_and_values_use_their_own_codecs():
    values_only = _values(_run(_Shrink(shrink_keys=False)))
    assert values_only["ip_rel_error"] == 0 and values_only["attn_kl"] == 0
    assert math.isclose(values_only["attn_output_error"], 0.1, rel_tol=1e-3)
    keys_only = _values(_run(_Shrink(shrink_keys=True)))
    # Shrinking every key by 10% shrinks every inner product: a pure bias, no spread around it
    assert keys_only["ip_bias"] < 0 and keys_only["attn_kl"] > 0
    assert math.isclose(keys_only["ip_rel_error"], 0.1, rel_tol=1e-3)


def test_intq_errors_spread_more_at_fewer_bits():
    stds = [_values(_run(IntQ(bits=b)))["ip_error_std"] for b in (8, 4, 2)]
    kls = [_values(_run(IntQ(bits=b)))["attn_kl"] for b in (8, 4, 2)]
    assert stds[0] < stds[1] < stds[2] and kls[0] < kls[1] < kls[2]


# --- a method's cache policy: not what proofs measure ------------------------------------------


def test_proofs_measure_the_bare_codec_and_say_what_they_leave_out():
    with_policy = _run(IntQ(bits=4, sinks=4, window=16))
    bare = _run(IntQ(bits=4))
    untimed = [name for name, spec in Proofs.metrics.items() if spec.timing is None]
    # the same codec, so the same figures: sinks and window never reach the vectors
    assert {n: with_policy.metrics[n].value for n in untimed} == \
        {n: bare.metrics[n].value for n in untimed}
    assert with_policy.info["policy_not_measured"] == [
        "first 4 tokens full precision (sinks)", "newest 16 tokens full precision (window)"]
    assert "policy_not_measured" not in bare.info


def test_the_report_names_the_methods_whose_policy_proofs_leave_out(small):
    from kvbench.benchmarks.reports.proofs import REPORT, bare_codec_note

    assert bare_codec_note(small) is None  # intq without sinks or window: nothing left out
    case = next(c for c in small.cases if c.benchmark == "proofs" and c.method == "intq")
    case.info["policy_not_measured"] = ["newest 16 tokens full precision (window)"]
    note = bare_codec_note(small)
    assert note.startswith("Proofs measure the bare codecs")
    assert f"{case.method_label} (newest 16 tokens full precision (window))" in note
    assert note in REPORT.sections(small)


POLICY_SUITE = """kvbench: 1
methods:
  - name: intq
    label: intq-w16
    params: {bits: 4, window: 16}
    claims: ["mse <= 0.01", "ppl_rel_delta <= 1"]
  - name: intq
    label: intq4
    params: {bits: 4}
benchmarks:
  - kind: proofs
    params: {n_vectors: 64, dim: 16}
    claims:
      - {cases: "proofs/intq4", claim: "cosine >= 0.99"}
      - {cases: "proofs/intq-*", claim: "cosine >= 0.98"}
  - kind: perplexity
    model: tiny:llama
    methods: [intq-w16]
    params: {context: 64, continuation: 16}
    claims:
      - {cases: "perplexity/intq-w16*", claim: "ppl_rel_delta <= 1"}
"""


def test_validate_refuses_a_proofs_claim_on_a_method_with_a_policy(tmp_path):
    from kvbench.suite import SuiteError, load_suite
    from tests.plugins.suites import line_of

    path = tmp_path / "suite.yaml"
    path.write_text(POLICY_SUITE)
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    # the scoped claim that reaches intq-w16 and its own claim on a proofs metric; intq4's claim,
    # and the claims on perplexity (a benchmark that runs the cache), stand
    scoped, own = sorted(caught.value.issues, key=lambda i: i.line, reverse=True)
    assert (scoped.line, scoped.key) == (line_of(path, "proofs/intq-*"),
                                         "benchmarks[0].claims[1].claim")
    assert (own.line, own.key) == (line_of(path, "mse <= 0.01"), "methods[0].claims[0]")
    assert str(scoped) == (
        f"{path}:{scoped.line}: benchmarks[0].claims[1].claim: claim 'cosine >= 0.98' is on"
        " method 'intq-w16', whose cache does more than its codecs (newest 16 tokens full"
        " precision (window)), and benchmark 'proofs' measures the codecs alone (its figure"
        " would be the bare codec's: claim it in a benchmark that runs the cache (perplexity,"
        " niah, quality), or leave the method out of the claim's cases)")



@pytest.mark.parametrize("name, params, unseen", [
    ("intq", {"sinks": 2}, ["first 2 tokens full precision (sinks)"]),
    ("sparse_v", {"base": "intq", "base_params": {"window": 8}, "tau": 1e-4},
     ["newest 8 tokens full precision (window)",
      "value rows under softmax weight 0.0001 skipped at decode (sparse V)"]),
    ("decay", {"window": 0, "evict_below": 0},
     ["segments requantized from 3 to 2 bits as they age"]),
    ("adaptive", {"base_params": {"block": 64, "window": 4}},
     ["newest 4 tokens full precision (window)",
      "per-KV-head widths set by calibration (its codecs: base_bits)"]),
    ("adaptive", {"base_params": {"block": 64}, "scale": 0}, []),
    ("turbo3", {}, []),
])
def test_what_a_method_does_beyond_its_codecs_is_named(name, params, unseen):
    from kvbench.methods import build_method

    assert build_method(name, params).policy_beyond_codec() == unseen
