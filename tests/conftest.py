"""Shared fixtures. Shared plain helpers live in tests/plugins (import them from there):
- tests.plugins.tensors: randn, token_ids, round_trip (seeded inputs, codec round trips)
- tests.plugins.model_runs: cpu_context (a RunContext), stepped_logits (prefill, then decode),
  methods_on (the methods a backend runs), mlx_session
- tests.plugins.suites: ROOT, SHIPPED_SUITES, SMALL_RESULTS, line_of
- tests.plugins.cli_support: invoke, kvbench_process and the CLI's console fixture

The Triton kernels run in Triton's interpreter where there is no CUDA device (TRITON_INTERPRET=1
is set below).

The bundled model is prepared once per session (into KVBENCH_HOME if set, else the default home);
tests that use it are marked `model`.
"""
import os
import sys
from pathlib import Path

import pytest

try:
    import torch
except ModuleNotFoundError:  # the dev extra alone: the modules that need torch skip (below)
    torch = None

# Without a GPU the Triton kernels run in Triton's interpreter, on CPU tensors. It is chosen
# when a kernel module is imported, so it is set before any test imports one; a machine with
# CUDA tests the compiled kernels on the GPU instead.
if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests never reach the Hugging Face Hub: set before huggingface_hub is imported (it reads this
# once), so a hub id a test names by mistake fails at once; the tests of hub downloads turn it
# off and point the client at a stand-in on 127.0.0.1 (tests.plugins.hub_standin).
os.environ["HF_HUB_OFFLINE"] = "1"

# One torch thread: with another process on the other core, two threads wait on each other at
# every barrier and the suite ran 10x slower (609 s against 53 s here); one costs 10% when idle.
if torch is not None:
    torch.set_num_threads(1)

# The extra that brings each module a test module may need: without it, the module is skipped
# with the install line (pip install -e .[dev] alone runs the rest of the tests).
EXTRA_OF = {
    **dict.fromkeys(("torch", "transformers", "safetensors", "gguf", "accelerate", "numba"),
                    "torch"),
    **dict.fromkeys(("mlx", "mlx_lm"), "mlx"),
    **dict.fromkeys(("fastapi", "uvicorn", "sse_starlette", "httpx", "prometheus_client"),
                    "serve"),
    "triton": "cuda", "ray": "ray", "matplotlib": "plots", "datasets": "datasets",
    "kvpress": "kvpress",
}


class _SkippedWithoutItsExtra(pytest.Module):
    """A test module whose imports need an extra that is not installed: skipped, naming it."""

    def _getobj(self):
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as exc:
            missing = exc.__cause__
            extra = (EXTRA_OF.get((missing.name or "").partition(".")[0])
                     if isinstance(missing, ModuleNotFoundError) else None)
            if extra is None:
                raise
            pytest.skip(f"needs {missing.name}: pip install 'kvbench[{extra}]'",
                        allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name.startswith("test_"):
        return _SkippedWithoutItsExtra.from_parent(parent, path=module_path)
    return None

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # suites name tests.plugins.kvb_testplugin:...; tests import tests.plugins
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def bundled():
    """The bundled model as a LoadedModel, prepared on first use (about half a minute, once)."""
    if torch is None:
        pytest.skip("needs torch: pip install 'kvbench[torch]'")
    from kvbench.models import load_model

    return load_model("bundled:smollm2-135m", "cpu")


@pytest.fixture(scope="session")
def bundled_session(bundled):
    """The bundled model as benchmarks drive it: a TorchSession on the CPU."""
    from kvbench.models.session import TorchSession

    return TorchSession(bundled, torch.device("cpu"))


@pytest.fixture(scope="session")
def bundled_mlx_session():
    """The bundled model on MLX (mlx-lm) as benchmarks drive it; skips without the mlx extra.
    MLX's reference BLAS makes it slow here: for slow tests."""
    pytest.importorskip("mlx.core", reason="the mlx extra is not installed")
    from tests.plugins.model_runs import mlx_session

    return mlx_session("bundled:smollm2-135m")


@pytest.fixture(scope="session")
def tiny_mlx_session():
    """tiny:llama on MLX as benchmarks drive it; skips without the mlx extra."""
    pytest.importorskip("mlx.core", reason="the mlx extra is not installed")
    from tests.plugins.model_runs import mlx_session

    return mlx_session("tiny:llama")


@pytest.fixture(scope="module")
def tiny_llama():
    """The tiny:llama test model on the CPU as a LoadedModel (`.model` is the transformers
    model); one per test module, so nothing one module does to it reaches another."""
    from kvbench.models import load_model

    return load_model("tiny:llama", "cpu")


@pytest.fixture(scope="module")
def tiny_sessions():
    """session(kind): tiny:KIND (kvbench.models.tiny_configs) on the CPU as benchmarks drive it,
    loaded once per test module."""
    from kvbench.models import load_model
    from kvbench.models.session import TorchSession

    made = {}

    def session(kind: str):
        if kind not in made:
            made[kind] = TorchSession(load_model(f"tiny:{kind}"), torch.device("cpu"))
        return made[kind]
    return session


@pytest.fixture
def torch_caches_join(monkeypatch):
    """Torch caches that join at every step and hold exactly their tokens (CodecCache's
    in_place off), as MLX's do (its arrays are not written in place): for tests that compare the
    two byte for byte, measured bytes included."""
    from kvbench.methods.core.codec_cache import CodecMethod

    monkeypatch.setattr(CodecMethod, "in_place", property(lambda self: False))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for the module, restored after it (the session already starts with one;
    this holds it against a test that changes it). Use with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def without_matplotlib(monkeypatch):
    """Importing matplotlib (or any of its modules) fails, as where it is not installed."""
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)


@pytest.fixture
def small():
    """tests/data/results_small.json, a real run of tests/data/small.yaml, as a RunResult (a
    fresh copy per test: tests may change it)."""
    from kvbench.results import load_results
    from tests.plugins.suites import SMALL_RESULTS

    return load_results(SMALL_RESULTS)


@pytest.fixture
def small_unplotted(small):
    """`small` without its attention-output errors: no proofs case can be plotted, so reports
    of it have no rate-distortion figure."""
    for case in small.cases:
        case.metrics.pop("attn_output_error", None)
    return small
