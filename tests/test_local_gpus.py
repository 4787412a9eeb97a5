"""`kvbench run --gpus`: one case per GPU at a time, each in a process that sees its GPU alone.
This machine has no GPU: the executor is given a stated list of devices (the count torch would
see is patched), and the cases, on device auto, run on the CPU in processes pinned as they
would be on a GPU machine."""
from __future__ import annotations

import json

import pytest

from kvbench.results import load_results
from kvbench.run import local_gpus
from kvbench.run.local_gpus import LocalGPUs, parse_gpus
from kvbench.run.runner import run_suite
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import invoke
from tests.plugins.extras import needs
from tests.plugins.kvb_testplugin import MEET, meeting

SUITE = """\
kvbench: 1
name: on-gpus
defaults: {{timeout_s: 600{defaults}}}
methods:
  - name: tests.plugins.kvb_testplugin:Nop
benchmarks:
  - kind: tests.plugins.kvb_testplugin:Meets
    matrix: {{i: {cases}}}
  - kind: tests.plugins.kvb_testplugin:Keeps
    params: {{i: 9}}
"""


def _suite(tmp_path, cases=(1, 2, 3), defaults="") -> str:
    path = tmp_path / "s.yaml"
    path.write_text(SUITE.format(cases=list(cases), defaults=defaults))
    return path


@pytest.fixture
def four_gpus(monkeypatch):
    """torch sees four CUDA devices, and this process is pinned to none of them."""
    monkeypatch.setattr(local_gpus, "visible_gpu_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _deterministic(path) -> list:
    return [(c.id, c.status, c.fingerprint, {n: m.value for n, m in c.metrics.items()},
             [(cl.claim, cl.verdict) for cl in c.claims]) for c in load_results(path).cases]


@needs("torch")
def test_four_cases_run_at_once_each_on_its_own_gpu_as_a_serial_run(tmp_path, four_gpus,
                                                                     monkeypatch):
    suite = _suite(tmp_path, cases=(1, 2, 3, 4))
    # the four Meets cases go on only once all four are running: one at a time never would
    monkeypatch.setenv(MEET, str(tmp_path / "meet"))
    meeting(tmp_path / "meet", 4)
    ran = invoke("run", suite, "--gpus", "all", "--out", tmp_path / "gpus")
    assert ran.exit_code == 0, ran.output
    run = load_results(tmp_path / "gpus/results.json")
    met = [c for c in run.cases if c.benchmark.endswith("Meets")]
    assert [c.status for c in run.cases] == ["ok"] * 5
    # each case's process saw one GPU, and the four running together saw four different ones
    assert sorted(c.info["cuda_visible_devices"] for c in met) == ["0", "1", "2", "3"]
    pids = {(tmp_path / "meet" / f"at-{i}").read_text() for i in (1, 2, 3, 4)}
    assert len(pids) == 4
    kept = [json.loads(line) for line in (tmp_path / "gpus/predictions.jsonl").open()]
    assert [k["i"] for k in kept] == [9]  # the driver wrote the child's record
    monkeypatch.delenv(MEET)
    serial = invoke("run", suite, "--out", tmp_path / "serial")
    assert serial.exit_code == 0, serial.output
    assert _deterministic(tmp_path / "gpus/results.json") == _deterministic(
        tmp_path / "serial/results.json")


class _Seen:
    """A Progress that keeps where each case started and every status text."""

    def __init__(self):
        self.started: list[tuple[str, str | None]] = []
        self.statuses: list[tuple[str, str | None]] = []

    def start(self, total, skipped): ...
    def notice(self, text): ...

    def case_started(self, case, where=None):
        self.started.append((case.id.rpartition("/")[2], where))

    def status(self, text, case_id=None):
        self.statuses.append((text, case_id))

    def case_finished(self, result): ...
    def stop(self): ...


@needs("torch")
def test_the_longest_cases_start_first_and_progress_names_each_gpu(tmp_path):
    seen = _Seen()
    suite = load_suite(_suite(tmp_path))  # Meets i=1..3 cost 1, 2, 3; Keeps costs 1
    run = run_suite(suite, tmp_path / "out", progress=seen, executor=LocalGPUs([0, 1])).result
    assert [c.status for c in run.cases] == ["ok"] * 4
    # i=3 and i=2 take the two GPUs first, whichever is quicker to start
    assert {case for case, _ in seen.started[:2]} == {"i=3", "i=2"}
    assert {where for _, where in seen.started} == {"gpu 0", "gpu 1"}
    [keeps] = [c for c in run.cases if c.benchmark.endswith("Keeps")]
    assert ("sample of case 9", keeps.id) in seen.statuses  # a child's status names its case


def test_gpus_are_parsed_against_the_devices_there_are():
    assert parse_gpus("all", 4) == [0, 1, 2, 3] and parse_gpus(" 3, 1 ", 4) == [3, 1]
    for text, visible, message in [
        ("0,7", 4, "--gpus '0,7': no GPU 7; this machine has 4 CUDA device(s) (0-3)"),
        ("all", 0, "--gpus all: this machine has 0 CUDA device(s); run without --gpus"),
        ("1,1", 4, "a GPU is listed twice"),
        ("cuda:1", 4, "expected all, or GPU indices such as 0,1,3"),
        ("", 4, "expected all"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_gpus(text, visible)


@needs("torch")
@pytest.mark.parametrize("args, message", [
    (["--gpus", "0,4"], "--gpus '0,4': no GPU 4; this machine has 4 CUDA device(s) (0-3)"),
    (["--gpus", "0", "--device", "cpu"], "--gpus runs cases on GPUs, and none of these would"),
    (["--gpus", "0", "--executor", "ray"], "--gpus is for --executor local"),
    (["--cpus-per-gpu", "2"], "--cpus-per-gpu is for --gpus or --executor ray"),
])
def test_what_gpus_cannot_run_is_refused_before_any_work(tmp_path, four_gpus, args, message):
    refused = invoke("run", _suite(tmp_path), "--out", tmp_path / "out", *args)
    assert refused.exit_code == 2, refused.output
    assert message in " ".join(refused.output.split())
    assert not (tmp_path / "out").exists()


@needs("torch")
def test_a_model_placed_by_device_map_is_refused(tmp_path, four_gpus):
    suite = _suite(tmp_path, defaults=", device_map: {a: 0, b: 1}")
    refused = invoke("run", suite, "--gpus", "all", "--out", tmp_path / "out")
    assert refused.exit_code == 2, refused.output
    assert "places its model itself (device_map): run it with --executor ray" in " ".join(
        refused.output.split())
    assert not (tmp_path / "out").exists()
