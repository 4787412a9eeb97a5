"""`kvbench run --executor ray` on GPU nodes, tested on a local Ray given four logical GPUs:
a case on device auto asks for one GPU and a few CPUs, Ray pins its process to that GPU, the
cases use the GPUs all at once, and a model split by device_map gets as many GPUs as it names.
The cases run on the CPU here (there is no real GPU), in processes pinned as on a GPU node."""
from __future__ import annotations

import pytest

from kvbench.models.options import LoadOptions
from kvbench.run.placement import WHOLE_NODE, devices_spanned
from kvbench.run.ray_executor import ray_refusal
from kvbench.run.runner import run_suite
from kvbench.suite.case import Case
from kvbench.suite.loader import load_suite
from tests.plugins.kvb_testplugin import MEET, meeting
from tests.plugins.suites import ROOT

SUITE = """\
kvbench: 1
name: on-ray-gpus
defaults: {{timeout_s: 600{defaults}}}
methods:
  - name: tests.plugins.kvb_testplugin:Nop
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Meets
    matrix: {{i: {cases}}}
"""


@pytest.fixture(scope="module")
def four_gpus(tmp_path_factory):
    """A local Ray with four logical GPUs and four CPUs; the folder where its workers' Meets
    cases meet (kvb_testplugin.MEET)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kvbench[ray]')")
    folder = tmp_path_factory.mktemp("meet")
    with pytest.MonkeyPatch.context() as patch:
        # what the workers inherit: the test plugins on the path, where to meet
        patch.setenv("PYTHONPATH", str(ROOT))
        patch.setenv(MEET, str(folder))
        ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")
        patch.delenv(MEET)  # a run in this process (the serial one) meets no one
        try:
            yield folder
        finally:
            ray.shutdown()


def _run(tmp_path, name: str, cases, defaults: str = "", executor=None):
    path = tmp_path / f"{name}.yaml"
    path.write_text(SUITE.format(cases=list(cases), defaults=defaults))
    return run_suite(load_suite(path), tmp_path / name, executor=executor).result


def _deterministic(run) -> list:
    return [(c.id, c.status, c.fingerprint, {n: m.value for n, m in c.metrics.items()})
            for c in run.cases]


def test_each_case_gets_its_own_gpu_and_the_gpus_are_used_at_once(four_gpus, tmp_path):
    from kvbench.run.ray_executor import RayExecutor

    meeting(four_gpus, 4)
    executor = RayExecutor(cpus_per_gpu=1)
    try:
        run = _run(tmp_path, "ray", (1, 2, 3, 4), executor=executor)
    finally:
        executor.close()
    assert [c.status for c in run.cases] == ["ok"] * 4, [c.error for c in run.cases]
    # four cases met, so ran at once, each pinned by Ray to a GPU of its own
    assert sorted(c.info["cuda_visible_devices"] for c in run.cases) == ["0", "1", "2", "3"]
    assert len({c.info["ray"]["pid"] for c in run.cases}) == 4
    assert _deterministic(run) == _deterministic(_run(tmp_path, "serial", (1, 2, 3, 4)))


@pytest.mark.slow
def test_a_model_split_over_two_gpus_asks_for_two(four_gpus, tmp_path):
    from kvbench.run.ray_executor import RayExecutor

    meeting(four_gpus, 2)
    executor = RayExecutor(cpus_per_gpu=1)
    try:
        run = _run(tmp_path, "split", (1, 2), ", device_map: {a: 0, b: 1}", executor)
    finally:
        executor.close()
    assert [c.status for c in run.cases] == ["ok"] * 2, [c.error for c in run.cases]
    seen = [c.info["cuda_visible_devices"].split(",") for c in run.cases]
    assert [len(gpus) for gpus in seen] == [2, 2]
    assert sorted(seen[0] + seen[1]) == ["0", "1", "2", "3"]  # at once: four GPUs in all


def test_the_gpus_a_device_map_spans():
    assert devices_spanned(LoadOptions()) == 1
    assert devices_spanned(LoadOptions(device_map={"a": 0, "b": "cuda:1", "c": "cpu"})) == 2
    assert devices_spanned(LoadOptions(device_map={"": "cuda:3"})) == 1
    assert devices_spanned(LoadOptions(device_map="auto",
                                       max_memory={"0": "70GiB", "1": "70GiB",
                                                   "cpu": "200GiB"})) == 2
    assert devices_spanned(LoadOptions(device_map="balanced")) == WHOLE_NODE


def test_a_case_naming_its_own_gpu_is_refused_on_ray():
    case = Case(id="b/m/x=1", benchmark="b", bench_params={}, method="m", method_label="m",
                method_params={}, model=None, device="cuda:1", seed=0, repeats=1,
                timeout_s=None)
    assert "case b/m/x=1 names cuda:1: set its device to cuda or auto" in ray_refusal([case])
    assert ray_refusal([Case(**{**case.__dict__, "device": "cuda"})]) is None
    placed = Case(**{**case.__dict__, "device": "cuda",
                     "load_options": LoadOptions(device_map={"a": 2, "b": 3})})
    assert "names GPU(s) 2, 3: number them 0 to 1" in ray_refusal([placed])
