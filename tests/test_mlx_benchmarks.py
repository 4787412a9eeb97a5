"""Every benchmark on the MLX backend, against the same case on torch (tiny model, small sizes)."""
import pytest

pytest.importorskip("mlx.core")

import torch  # noqa: E402

from kvbench.benchmarks import measurement  # noqa: E402
from kvbench.benchmarks.specs.ladder import Ladder, LadderParams  # noqa: E402
from kvbench.benchmarks.specs.parity import Parity, ParityParams  # noqa: E402
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams  # noqa: E402
from kvbench.benchmarks.specs.proofs import Proofs, ProofsParams  # noqa: E402
from kvbench.benchmarks.specs.quality import Quality, QualityParams  # noqa: E402
from kvbench.benchmarks.specs.speed import Speed, SpeedParams  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.models.mlx_loading import load_mlx_model  # noqa: E402
from tests.plugins.model_runs import cpu_context  # noqa: E402

TINY = "tiny:llama"


def run(benchmark_cls, params, name, method_params=None, backend="torch", **context):
    """One case, as the runner runs it: the benchmark's measurement, handed the method's
    implementation for the case's backend."""
    method = implementation(build_method(name, method_params or {}), backend)
    return measurement(benchmark_cls).run(params, method,
                                          cpu_context(TINY, backend=backend, **context))


def _both(benchmark_cls, params, name, method_params=None):
    """The case's metrics on torch, then on MLX."""
    return [run(benchmark_cls, params, name, method_params, b).metrics for b in ("torch", "mlx")]


@pytest.mark.parametrize("name, params", [("identity", {}), ("intq", {"bits": 4}),
                                          ("turbo3", {"block": 64}), ("kivi", {"bits": 2})])
def test_proofs_agree_across_backends(name, params):
    torch_m, mlx_m = _both(Proofs, ProofsParams(n_vectors=512, dim=64), name, params)
    assert mlx_m["nbytes"].value == torch_m["nbytes"].value
    assert mlx_m["mse"].value == pytest.approx(torch_m["mse"].value, rel=1e-3, abs=1e-12)
    assert mlx_m["cosine"].value == pytest.approx(torch_m["cosine"].value, rel=1e-5)


@pytest.mark.parametrize("name", ["identity", "intq"])
def test_perplexity_quality_and_parity_agree_across_backends(name):
    ppl = _both(Perplexity, PerplexityParams(context=48, continuation=12), name)
    assert ppl[1]["perplexity"].value == pytest.approx(ppl[0]["perplexity"].value, rel=1e-4)
    assert ppl[1]["kv_bytes"].value == ppl[0]["kv_bytes"].value
    quality = _both(Quality, QualityParams(context=48, continuation=8, greedy_tokens=6),
                    name)
    assert quality[1]["kl_plain_method"].value == pytest.approx(
        quality[0]["kl_plain_method"].value, rel=1e-2, abs=1e-7)
    parity = _both(Parity, ParityParams(context=29, steps=5), name)
    if name == "identity":
        assert parity[1]["max_logit_diff"].value < 1e-4
        assert parity[1]["greedy_agreement"].value == 1
    else:
        assert parity[1]["mean_kl"].value == pytest.approx(parity[0]["mean_kl"].value, rel=1e-2)


def test_ladder_on_mlx_counts_the_same_kv_and_reads_mlx_peak():
    params = LadderParams(length=200, prefill_chunk=64, decode=3, calibration=0)
    torch_m, mlx_m = _both(Ladder, params, "intq", {"bits": 4})
    for name in ("retained_kv_bytes", "kv_high_water_bytes", "retained_kv"):
        assert mlx_m[name].value == torch_m[name].value
    # MLX's allocator peak: the weights it holds and the cache at least
    assert mlx_m["peak_bytes"].value >= mlx_m["weights_bytes"].value + (
        mlx_m["retained_kv_bytes"].value)


def test_speed_runs_on_mlx_and_counts_the_same_bytes():
    params = SpeedParams(n_vectors=4096, dim=64, warmup=0)
    torch_m, mlx_m = (run(Speed, params, "turbo3", {"block": 64}, b, repeats=2).metrics
                      for b in ("torch", "mlx"))
    assert mlx_m["nbytes"].value == torch_m["nbytes"].value
    assert mlx_m["encode_gb_s"].value > 0 and mlx_m["memcpy_gb_s"].value > 0
    assert len(mlx_m["encode_vs_memcpy"].samples) == 2


def test_parity_after_a_rewind_on_mlx():
    out = run(Parity, ParityParams(context=40, steps=6, trim=13), "identity",
              backend="mlx").metrics
    assert out["max_logit_diff"].value < 1e-4 and out["greedy_agreement"].value == 1
    with pytest.raises(ValueError, match="took back 0 of the 13"):
        run(Parity, ParityParams(context=40, steps=6, trim=13), "intq", backend="mlx")


def test_adaptive_calibrates_on_mlx_from_the_mlx_models_own_attention(monkeypatch, tiny_llama):
    """The MLX session measures attention entropy on the MLX model and hands it over; no torch
    model is loaded for it. The entropies are torch's to float32 rounding, so are the widths."""
    from kvbench.models import loading
    from kvbench.models.mlx_session import MLXSession
    from kvbench.models.session import TorchSession

    torch_session = TorchSession(tiny_llama, torch.device("cpu"))
    mlx_session = MLXSession(load_mlx_model(TINY))
    tokens = torch_session.tokenizer.encode("Peaked heads keep more bits, diffuse fewer. " * 8)
    params = {"base": "lloydmax", "base_bits": 3, "scale": 1.0}
    on_torch = implementation(build_method("adaptive", params), "torch")
    on_mlx = implementation(build_method("adaptive", params), "mlx")
    torch_session.calibrate(on_torch, tokens[:300])  # more rows than one chunk

    def refuse(*args, **kwargs):
        raise AssertionError("MLX calibration loaded a torch model")

    monkeypatch.setattr(loading, "load_model", refuse)
    mlx_session.calibrate(on_mlx, tokens[:300])
    torch.testing.assert_close(on_mlx.entropy, on_torch.entropy, rtol=1e-5, atol=1e-6)
    assert on_mlx.head_bits == on_torch.head_bits
    assert len({b for row in on_mlx.head_bits for b in row}) > 1
    # and a benchmark on MLX calibrates it so
    out = run(Perplexity, PerplexityParams(context=48, continuation=12, calibration=64),
              "adaptive", params, "mlx")
    assert sum(v for k, v in out.info.items() if k.startswith("kv_heads_")) == 4
