"""`kvbench run --executor ray` on a real two-node Ray cluster started here on this machine:
the same results as a local run, a killed worker costs one retry, a hang is killed, and the run
never hangs."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvbench.results import load_results
from tests.plugins.cli_support import invoke, kvbench_process, load_json, wait_until
from tests.plugins.extras import needs
from tests.plugins.suites import ROOT
from tests.plugins.waits import HANG_S

# A cluster made by `ray start` asks clients for a token unless this is set (in every process).
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}

SUITE = """\
kvbench: 1
name: on-ray
defaults: {{timeout_s: 600, threads: 1}}  # each case asks the one-CPU nodes for one
methods:
  - name: tests.plugins.kvb_testplugin:Nop
    matrix: {{knob: [1, 2]}}
benchmarks:
{first}
  - kind: tests.plugins.kvb_testplugin:Keeps
    params: {{sleep_s: 0.5}}
    matrix: {{i: [1, 2, 3]}}
    claims:
      - {{cases: "*", claim: "value <= 3"}}
"""


def _suite(tmp_path: Path, first: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(SUITE.format(first=first))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A Ray head and one more node on this machine, one CPU each; their address."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kvbench[ray]')")
    saved = {key: os.environ.get(key) for key in NO_AUTH}
    os.environ.update(NO_AUTH)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the workers import the test plugins
    port = _free_port()
    address = f"127.0.0.1:{port}"
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
               "--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0",
               "--object-store-memory=100000000", "--disable-usage-stats"]
    nodes = [subprocess.Popen([*ray_cli, "--head", f"--port={port}", "--include-dashboard=false"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_for_nodes(ray, address, 1)
        nodes.append(subprocess.Popen([*ray_cli, f"--address={address}"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_nodes(ray, address, 2)
        yield address
    finally:
        for node in reversed(nodes):
            node.terminate()  # `ray start --block` stops its node's processes as it exits
            node.wait(timeout=HANG_S)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _wait_for_nodes(ray, address: str, count: int, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            try:
                if sum(node["Alive"] for node in ray.nodes()) >= count:
                    return
            finally:
                ray.shutdown()
        except (ConnectionError, RuntimeError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the Ray cluster at {address} did not reach {count} node(s)")
        time.sleep(0.5)


def _on_ray(args: list, cwd: Path, timeout: float = HANG_S) -> tuple[int, str]:
    proc = kvbench_process(["run", *args], cwd, **NO_AUTH)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"kvbench run on Ray did not end within {timeout} s: {proc.stdout.read()}")
    return proc.returncode, out


def _deterministic(path: Path) -> list:
    """Per case: id, status, fingerprint, every metric that the same inputs reproduce, claims."""
    run = load_results(path)
    return [(c.id, c.status, c.fingerprint,
             {name: m.value for name, m in c.metrics.items() if m.timing is None},
             [(cl.claim, cl.verdict, cl.measured) for cl in c.claims]) for c in run.cases]


@needs("torch")  # asked first: every case needs it
def test_without_ray_the_executor_is_refused_with_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = invoke("run", _suite(tmp_path), "--executor", "ray", "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "pip install 'kvbench[ray]'" in result.output
    assert not (tmp_path / "out").exists()  # refused before any work


def test_local_only_options_are_refused(tmp_path):
    suite = _suite(tmp_path)
    refused = invoke("run", suite, "--address", "127.0.0.1:1")
    assert refused.exit_code == 2 and "--address is for --executor ray" in refused.output
    refused = invoke("run", suite, "--executor", "ray", "--isolate")
    assert refused.exit_code == 2 and "--isolate is for --executor local" in refused.output


def test_a_suite_on_the_cluster_equals_the_local_run(cluster, tmp_path):
    suite = _suite(tmp_path)
    assert invoke("run", suite, "--out", tmp_path / "local").exit_code == 0
    code, out = _on_ray([suite, "--executor", "ray", "--address", cluster,
                         "--out", tmp_path / "ray"], tmp_path)
    assert code == 0, out
    assert _deterministic(tmp_path / "ray/results.json") == \
        _deterministic(tmp_path / "local/results.json")
    run = load_json(tmp_path / "ray/results.json")
    assert [c["info"]["ray"]["attempt"] for c in run["cases"]] == [1] * 6
    # 0.5 s cases on two one-CPU nodes: both nodes' workers ran some
    assert len({c["info"]["ray"]["pid"] for c in run["cases"]}) >= 2
    kept = (tmp_path / "ray/predictions.jsonl").read_text().splitlines()
    assert len(kept) == 6 and str(os.getpid()) not in "".join(kept)


@pytest.mark.slow
def test_a_worker_killed_mid_case_costs_one_retry(cluster, tmp_path):
    marker = tmp_path / "dies-once.pid"
    first = ("  - kind: tests.plugins.kvb_testplugin:DiesOnce\n"
             f"    params: {{log: {str(marker)!r}}}\n    methods: [Nop-knob1]")
    proc = kvbench_process(["run", _suite(tmp_path, first), "--executor", "ray", "--address",
                            cluster, "--out", tmp_path / "out"], tmp_path, **NO_AUTH)
    wait_until(lambda: marker.exists() and marker.read_text().endswith("\n"), proc,
               "the case's worker started", timeout=HANG_S)
    time.sleep(1)  # for the driver to hear where the case started: the warning names the pid
    os.kill(int(marker.read_text()), signal.SIGKILL)
    out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out
    cases = {c.benchmark.rpartition(":")[2]: c for c in load_results(tmp_path / "out/results.json"
                                                                     ).cases}
    retried = cases["DiesOnce"]
    assert retried.status == "ok" and retried.info["ray"]["attempt"] == 2
    [warning] = retried.warnings
    assert warning.startswith("attempt 1: its Ray worker") and "died" in warning
    assert f"pid {marker.read_text().strip()}" in warning
    assert len(load_results(tmp_path / "out/results.json").cases) == 7


def test_an_interrupted_ray_run_keeps_its_cases_stops_its_tasks_and_resumes(cluster, tmp_path):
    marker = tmp_path / "blocks.pid"
    first = ("  - kind: tests.plugins.kvb_testplugin:DiesOnce\n"
             f"    params: {{log: {str(marker)!r}}}\n    methods: [Nop-knob1]")
    suite, out = _suite(tmp_path, first), tmp_path / "out"
    proc = kvbench_process(["run", suite, "--executor", "ray", "--address", cluster,
                            "--out", out], tmp_path, **NO_AUTH)
    finished = lambda: (out / "results.jsonl").exists() and len(  # noqa: E731
        (out / "results.jsonl").read_text().splitlines()) >= 1 + 6
    wait_until(lambda: marker.exists() and finished(), proc, "six cases finished",
               timeout=HANG_S)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, output
    assert "--resume" in output
    blocked = int(marker.read_text())
    deadline = time.monotonic() + HANG_S
    while _alive(blocked) and time.monotonic() < deadline:  # its task was cancelled
        time.sleep(0.2)
    assert not _alive(blocked)
    resumed = invoke("run", suite, "--out", out, "--resume")  # locally: the same run
    assert resumed.exit_code == 0, resumed.output
    assert "resuming: 6 finished case(s) kept, 1 to run" in resumed.output


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_case_whose_worker_dies_twice_is_an_error_and_the_run_goes_on(cluster, tmp_path):
    first = "  - kind: tests.plugins.kvb_testplugin:Segfault\n    methods: [Nop-knob1]"
    code, out = _on_ray([_suite(tmp_path, first), "--executor", "ray", "--address", cluster,
                         "--out", tmp_path / "out"], tmp_path)
    assert code == 3, out
    run = load_results(tmp_path / "out/results.json")
    seen = [(c.id, c.status, c.error, c.info.get("ray")) for c in run.cases]  # shown on failure
    [dead] = [c for c in run.cases if c.status != "ok"]
    assert dead.error.type == "WorkerDied" and dead.info["ray"]["attempt"] == 2, seen
    assert dead.error.message.startswith("attempt 1: its Ray worker on ")
    assert "; attempt 2: its Ray worker on " in dead.error.message
    assert sum(c.status == "ok" for c in run.cases) == 6


@pytest.mark.slow
def test_a_hang_past_its_timeout_is_killed(cluster, tmp_path):
    from kvbench.run.ray_executor import RayExecutor
    from kvbench.run.runner import run_suite
    from kvbench.suite.loader import load_suite

    # Only the hang has the 1-second limit (on a loaded machine the six other cases ran past
    # 1 s). It must end as a timeout whose worker was killed: a run that waited out the 600 s
    # sleep could not say so, and no stopwatch is needed to tell.
    first = ("  - kind: tests.plugins.kvb_testplugin:Hang\n    params: {sleep_s: 600}\n"
             "    methods: [Nop-knob1]\n    timeout_s: 1")
    suite = load_suite(_suite(tmp_path, first))
    executor = RayExecutor(address=cluster, grace_s=1)
    try:
        run = run_suite(suite, tmp_path / "out", executor=executor).result
    finally:
        executor.close()
    [hung] = [c for c in run.cases if c.status != "ok"]
    assert hung.status == "timeout" and "its Ray worker was killed" in hung.error.message
    assert sum(c.status == "ok" for c in run.cases) == 6


def test_cases_no_node_can_hold_are_refused_before_running(cluster, tmp_path):
    code, out = _on_ray([_suite(tmp_path), "--executor", "ray", "--address", cluster,
                         "--device", "cuda", "--out", tmp_path / "out"], tmp_path)
    assert code == 2, out
    assert "no node of the Ray cluster has 1 CPU(s) and 1 GPU(s)" in out
    assert not (tmp_path / "out/results.json").exists()


QUICK = ROOT / "suites/quick.yaml"


def _quick_local_and_on_ray(cluster, tmp_path, *select):
    local = invoke("run", QUICK, "--out", tmp_path / "local", *select)
    assert local.exit_code == 0, local.output
    code, out = _on_ray([QUICK, "--executor", "ray", "--address", cluster,
                         "--out", tmp_path / "ray", *select], ROOT)
    assert code == 0, out
    ours, theirs = (_deterministic(tmp_path / f"{where}/results.json")
                    for where in ("ray", "local"))
    assert ours == theirs
    return ours


@pytest.mark.slow
@pytest.mark.model
def test_the_bundled_model_on_ray_gives_the_local_results(cluster, tmp_path, bundled):
    """The quick suite's proofs (on K/V captured from the model too) and its needle cases, for
    two methods."""
    cases = _quick_local_and_on_ray(cluster, tmp_path, "--methods", "identity,intq-bits4",
                                    "--only", "[pn][ri]*")  # proofs and niah, not perplexity
    assert len(cases) == 8 and {case_id.split("/")[0] for case_id, *_ in cases} == {
        "proofs", "niah"}


@pytest.mark.slow
@pytest.mark.model
def test_the_quick_suite_on_ray_gives_the_local_results(cluster, tmp_path, bundled):
    cases = _quick_local_and_on_ray(cluster, tmp_path)
    assert len(cases) == 18
