"""Every benchmark on the MLX backend, against the same case on torch (tiny model, small sizes)."""
import pytest

pytest.importorskip("mlx.core")

import torch  # noqa: E402

from kvbench.benchmarks.base import RunContext  # noqa: E402
from kvbench.benchmarks.parity import Parity, ParityParams  # noqa: E402
from kvbench.benchmarks.perplexity import Perplexity, PerplexityParams  # noqa: E402
from kvbench.benchmarks.proofs import Proofs, ProofsParams  # noqa: E402
from kvbench.benchmarks.quality import Quality, QualityParams  # noqa: E402
from kvbench.benchmarks.speed import Speed, SpeedParams  # noqa: E402
from kvbench.methods.base import build_method  # noqa: E402
from kvbench.models import load_model  # noqa: E402
from kvbench.models.mlx_host import load_mlx_model  # noqa: E402


def _load(spec, device, backend="torch"):
    return load_mlx_model(spec) if backend == "mlx" else load_model(spec, device)


def _ctx(backend, repeats=1):
    return RunContext(device=torch.device("cpu"), seed=0, repeats=repeats, model="tiny:llama",
                      load_model=_load, backend=backend)


def _both(benchmark, params, name, method_params=None):
    """The case's metrics on torch, then on MLX."""
    return [benchmark.run(params, build_method(name, method_params or {}), _ctx(b)).metrics
            for b in ("torch", "mlx")]


@pytest.mark.parametrize("name, params", [("identity", {}), ("intq", {"bits": 4}),
                                          ("turbo3", {"block": 64}), ("kivi", {"bits": 2})])
def test_proofs_agree_across_backends(name, params):
    torch_m, mlx_m = _both(Proofs(), ProofsParams(n_vectors=512, dim=64), name, params)
    assert mlx_m["nbytes"].value == torch_m["nbytes"].value
    assert mlx_m["mse"].value == pytest.approx(torch_m["mse"].value, rel=1e-3, abs=1e-12)
    assert mlx_m["cosine"].value == pytest.approx(torch_m["cosine"].value, rel=1e-5)


@pytest.mark.parametrize("name", ["identity", "intq"])
def test_perplexity_quality_and_parity_agree_across_backends(name):
    ppl = _both(Perplexity(), PerplexityParams(context=48, continuation=12), name)
    assert ppl[1]["perplexity"].value == pytest.approx(ppl[0]["perplexity"].value, rel=1e-4)
    assert ppl[1]["kv_bytes"].value == ppl[0]["kv_bytes"].value
    quality = _both(Quality(), QualityParams(context=48, continuation=8, greedy_tokens=6),
                    name)
    assert quality[1]["kl_plain_method"].value == pytest.approx(
        quality[0]["kl_plain_method"].value, rel=1e-2, abs=1e-7)
    parity = _both(Parity(), ParityParams(context=29, steps=5), name)
    if name == "identity":
        assert parity[1]["max_logit_diff"].value < 1e-4
        assert parity[1]["greedy_agreement"].value == 1
    else:
        assert parity[1]["mean_kl"].value == pytest.approx(parity[0]["mean_kl"].value, rel=1e-2)


def test_speed_runs_on_mlx_and_counts_the_same_bytes():
    params = SpeedParams(n_vectors=4096, dim=64, warmup=0)
    torch_m, mlx_m = (Speed().run(params, build_method("turbo3", {"block": 64}),
                                  _ctx(b, repeats=2)).metrics for b in ("torch", "mlx"))
    assert mlx_m["nbytes"].value == torch_m["nbytes"].value
    assert mlx_m["encode_gb_s"].value > 0 and mlx_m["memcpy_gb_s"].value > 0
    assert len(mlx_m["encode_vs_memcpy"].samples) == 2


def test_parity_after_a_rewind_on_mlx():
    out = Parity().run(ParityParams(context=40, steps=6, trim=13), build_method("identity"),
                       _ctx("mlx")).metrics
    assert out["max_logit_diff"].value < 1e-4 and out["greedy_agreement"].value == 1
    with pytest.raises(ValueError, match="took back 0 of the 13"):
        Parity().run(ParityParams(context=40, steps=6, trim=13), build_method("intq"),
                     _ctx("mlx"))
