"""Every registered method (kvbench's and any plug-in installed through the entry point) keeps
the contract kvbench.testing checks, on torch and on MLX where it has an implementation."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kvbench.config.fields import SettingError
from kvbench.methods import METHODS, has_implementation, implementation
from kvbench.methods.core.wrappers import SparseVMethod
from kvbench.methods.settings import implements
from kvbench.methods.settings.intq import IntQ
from kvbench.methods.settings.sparse_v import SparseV
from kvbench.methods.settings.tokens import TokenMethod
from kvbench.methods.torch.intq import TorchIntQ
from kvbench.methods.torch.token_cache import ScorerCache, TorchTokenMethod
from kvbench.testing import HEAD_DIM, ConformanceError, check_method
from tests.plugins.extras import method_extra_missing
from tests.plugins.examples import EXAMPLES, install_and_test

CASES = [(name, i) for name in METHODS.names()
         for i in range(len(METHODS.get(name).conformance_params))]


def _ids(case):
    name, i = case
    return f"{name}[{METHODS.get(name).conformance_params[i]}]"


def _method(case, backend: str):
    """The case's settings; skipped, saying why, where its extra is absent (with the install
    line), it has no implementation on `backend` (mlx-lm's caches: MLX only), or it cannot hold
    the kit's vectors of HEAD_DIM values (mlx-lm's quantized cache: groups of 32 and more)."""
    name, i = case
    cls = METHODS.get(name)
    missing = method_extra_missing(cls)
    if missing:
        pytest.skip(missing)
    if not has_implementation(cls, backend):
        pytest.skip(f"{name} has no {backend} implementation")
    settings = cls(**cls.conformance_params[i])
    try:
        settings.check_head_dim(HEAD_DIM)
    except SettingError as exc:
        pytest.skip(f"the kit's vectors have {HEAD_DIM} values: {exc}")
    return settings


@pytest.mark.parametrize("case", CASES, ids=map(_ids, CASES))
def test_torch_cpu(case):
    check_method(_method(case, "torch"), backend="torch", device="cpu")


@pytest.mark.parametrize("case", CASES, ids=map(_ids, CASES))
def test_mlx_cpu(case):
    pytest.importorskip("mlx.core")

    check_method(_method(case, "mlx"), backend="mlx")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("case", CASES, ids=map(_ids, CASES))
def test_torch_cuda(case):
    check_method(_method(case, "torch"), backend="torch", device="cuda")


def test_the_example_plugin_package_installs_and_passes(tmp_path):
    """The eviction plug-in example of docs/writing-a-method.md: installed as a package, found
    through the entry point, checked with kvbench.testing by its own test file."""
    done = install_and_test("example_plugin", "test_knorm.py", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    # the page shows the package's source as it is, so its example is what ran here
    page = (Path(__file__).parents[1] / "docs" / "writing-a-method.md").read_text()
    for name in ("__init__.py", "torch_cache.py"):
        source = (EXAMPLES / "example_plugin" / "kvbench_knorm" / name).read_text()
        assert f"`kvbench_knorm/{name}`" in page and f"```python\n{source}```\n" in page


# ---- the checks fail a method that breaks the contract -----------------------------------------

@dataclass
class _Broken(TokenMethod):
    """A StreamingLLM-like method with one fault chosen by `fault`."""

    fault: str = ""


class _BrokenCache(ScorerCache):
    reads_queries = False
    holds_budget = True

    def protected(self, size):
        return 1, size - 1

    def append(self, keys, values, queries=None):
        if self.method.fault == "zero values":
            values = torch.zeros_like(values)
        super().append(keys, values, queries)

    def observe_queries(self, queries):
        if self.method.fault == "one-token eviction" and queries.shape[-2] > 1:
            return
        super().observe_queries(queries)


@implements(_Broken)
class _TorchBroken(TorchTokenMethod):
    cache = _BrokenCache


@pytest.mark.parametrize("fault, check", [
    ("zero values", "the cache is read"),
    ("one-token eviction", "multi-token decode"),
])
def test_a_method_that_breaks_the_contract_fails(fault, check):
    with pytest.raises(ConformanceError, match=check):
        check_method(_Broken(ratio=0.5, fault=fault), model=False)


def test_a_tensor_made_without_the_keys_device_fails():
    class MadeOnDefault(_BrokenCache):
        def compact(self, index):
            # the sink's index made again without device=: the CPU here, the wrong one on CUDA
            sink = torch.zeros(1, index.shape[1], 1, dtype=index.dtype)
            super().compact(torch.cat([sink, index[..., 1:]], dim=-1))

    @dataclass
    class Careless(_Broken):
        pass

    @implements(Careless)
    class TorchCareless(TorchTokenMethod):
        cache = MadeOnDefault

    with pytest.raises(ConformanceError, match="tensors on the keys' device") as caught:
        check_method(Careless(ratio=0.5), model=False)
    assert "(torch.zeros(..., device=keys.device), or x.new_zeros(...))" in str(caught.value)


def test_scores_of_the_wrong_shape_are_named_with_the_shape_they_must_have():
    class Transposed(_BrokenCache):
        def protected(self, size):
            return 0, 0

        def scores(self):  # (tokens, heads): a plug-in author's easy slip
            return self.keys.norm(dim=-1)[0].T

    @dataclass
    class Sideways(_Broken):
        pass

    @implements(Sideways)
    class TorchSideways(TorchTokenMethod):
        cache = Transposed

    with pytest.raises(ConformanceError) as caught:
        check_method(Sideways(ratio=0.5), model=False)
    assert ("Transposed.scores() returned shape (48, 2); it must be (heads, tokens) = (2, 48),"
            " or (1, 48) for one mask shared by the heads") in str(caught.value)


def test_a_passing_method_says_what_was_checked():
    checked = check_method(_Broken(ratio=0.5), model=False)
    assert checked[:2] == ["bytes and tokens", "the cache is read"]
    assert "tensors on the keys' device" in checked


def test_a_wrapper_that_hides_its_probe_fails():
    @dataclass
    class ProbeEater(SparseV):
        def reference_probe(self, prompt):
            return []

    @implements(ProbeEater)
    class ProbeEaterMethod(SparseVMethod):
        pass

    with pytest.raises(ConformanceError, match="queries: repeat needs its reference probe"):
        check_method(ProbeEater(base="am", base_params={"ratio": 0.5, "queries": "repeat"}),
                     model=False)


def test_a_method_claiming_a_shared_prefill_it_does_not_have_fails():
    # intq reading what it stored: the prompt's attention reads its keys and values quantized
    @dataclass
    class Claims(IntQ):
        pass

    @implements(Claims)
    class TorchClaims(TorchIntQ):
        shares_prefill = True

    with pytest.raises(ConformanceError, match="shared prefill: its own prefill gives other"):
        check_method(Claims(bits=4, prefill_reads="stored"))


def test_a_score_only_method_registers_its_cache_class_alone():
    """`@implements` on a layer cache makes the torch implementation that holds one per layer,
    and the decorated class stays the cache: a plug-in writes one class."""
    @dataclass
    class Newest(TokenMethod):
        pass

    @implements(Newest)
    class NewestCache(ScorerCache):
        reads_queries = False

        def scores(self):
            return torch.arange(self.keys.shape[-2], dtype=torch.float32,
                                device=self.keys.device).expand(
                self.keys.shape[1], -1)

    assert issubclass(NewestCache, ScorerCache)
    method = implementation(Newest(ratio=0.5))
    assert isinstance(method, TorchTokenMethod) and method.cache is NewestCache
    assert type(method.new_layer_cache(0)) is NewestCache
    check_method(Newest(ratio=0.5), model=False)
