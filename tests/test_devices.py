"""Devices by name: cuda:N in a suite and on `kvbench run`, `validate`, `serve` and `env`; a
device this machine lacks refused before any work, saying what it has; the device's name and
memory in the results' machine fingerprint. There is no GPU here: torch.cuda is stood in for by
a machine with one device (FakeCuda)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvbench.backends import torch_backend
from kvbench.backends.devices import check_device_name
from kvbench.hardware import fingerprint
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.cli_support import invoke

SUITE = """\
kvbench: 1
name: devices
defaults: {{model: "tiny:llama", device: {device}, repeats: 1}}
methods:
  - name: identity
benchmarks:
  - kind: perplexity
    params: {{context: 32, continuation: 8}}
"""
GIB = 2**30


@pytest.fixture
def one_gpu(monkeypatch):
    """torch as a machine with one CUDA device, cuda:0, of 80 GiB, sees it."""
    properties = SimpleNamespace(name="Fake H100", total_memory=80 * GIB)

    def checked(index):
        index = index.index if isinstance(index, torch.device) else index
        assert index in (None, 0), f"torch asked about cuda:{index}, which does not exist"
        return properties

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", checked)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: checked(index).name)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def _suite(tmp_path, device: str):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(device=device))
    return path


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:7", "mps"])
def test_every_form_of_a_device_name_is_taken(name):
    assert check_device_name(name) == name


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA:1", "cpu:0",
                                  "cuda:1 "])
def test_other_names_are_refused_naming_the_forms(name):
    with pytest.raises(ValueError, match=r"is not one of auto, cpu, cuda, cuda:N"):
        check_device_name(name)


def test_a_suite_names_a_cuda_device_by_its_index(tmp_path):
    """Read without torch asking whether the device exists: the machine that validates a suite
    need not be the one that runs it."""
    cases = load_suite(_suite(tmp_path, '"cuda:1"')).cases
    assert cases and {case.device for case in cases} == {"cuda:1"}


def test_a_suite_with_a_malformed_device_names_the_file_line_and_forms(tmp_path):
    with pytest.raises(SuiteError) as caught:
        load_suite(_suite(tmp_path, '"cuda:one"'))
    (issue,) = caught.value.issues
    assert (issue.key, issue.line) == ("defaults.device", 3)
    assert "'cuda:one' is not one of auto, cpu, cuda, cuda:N" in issue.message


def test_the_command_line_takes_cuda_n_and_refuses_malformed_names(tmp_path):
    path = _suite(tmp_path, "cpu")
    valid = invoke("validate", path, "--device", "cuda:1")
    assert valid.exit_code == 0, valid.output
    listed = invoke("run", path, "--device", "cuda:1", "--dry-run")
    assert listed.exit_code == 0, listed.output
    refused = invoke("run", path, "--device", "cuda1", "--dry-run")
    assert refused.exit_code == 2 and "cuda:N (the N-th CUDA device" in refused.output


def test_a_cuda_device_beyond_the_visible_ones_is_refused_saying_what_is_there(one_gpu):
    assert torch_backend.resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError) as caught:
        torch_backend.resolve_device("cuda:3")
    assert "device 'cuda:3' does not exist: torch sees 1 CUDA device(s)" in str(caught.value)
    assert "visible here: cpu, cuda:0 (Fake H100)" in str(caught.value)


def test_cuda_visible_devices_is_named_when_it_hides_devices(one_gpu, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES='2'"):
        torch_backend.resolve_device("cuda:1")


def test_any_cuda_device_on_a_machine_without_cuda_is_refused_saying_what_is_there(no_gpu):
    for name in ("cuda", "cuda:0", "cuda:2"):
        with pytest.raises(ValueError, match=r"torch sees no CUDA device.*visible here: cpu$"):
            torch_backend.resolve_device(name)


def test_run_refuses_an_absent_device_before_any_case_runs(one_gpu, tmp_path):
    out = tmp_path / "out"
    result = invoke("run", _suite(tmp_path, "cpu"), "--device", "cuda:3", "--out", out)
    assert result.exit_code == 2
    assert "device 'cuda:3' does not exist" in result.output
    assert "cuda:0 (Fake H100)" in result.output
    assert not out.exists()  # nothing written: nothing ran


def test_serve_refuses_an_absent_device_before_loading_the_model(one_gpu, monkeypatch):
    pytest.importorskip("fastapi")
    import kvbench.models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(kvbench.models, "load_model", never)
    result = invoke("serve", "--model", "tiny:llama", "--device", "cuda:3")
    assert result.exit_code == 2
    assert "device 'cuda:3' does not exist: torch sees 1 CUDA device(s)" in result.output


def test_the_fingerprint_names_the_device_and_its_memory(one_gpu):
    machine = fingerprint("cuda:0")
    assert machine["device"] == "Fake H100"
    assert machine["device_memory_gib"] == 80.0
    assert machine["key"].endswith("-fake-h100")
    assert "device_memory_gib" not in fingerprint("cpu")  # the CPU's is memory_gib


def test_env_prints_a_named_devices_memory_and_refuses_an_absent_one(one_gpu):
    shown = invoke("env", "--device", "cuda:0")
    assert shown.exit_code == 0, shown.output
    assert "device: Fake H100" in shown.output and "device_memory_gib: 80.0" in shown.output
    refused = invoke("env", "--device", "cuda:1")
    assert refused.exit_code == 2 and "does not exist" in refused.output


def test_a_kvbench_server_the_stress_benchmark_starts_keeps_the_cases_device_by_name():
    from kvbench.benchmarks.measure.kvbench_serve import ServeOptions, kvbench_server
    from kvbench.methods import implementation
    from kvbench.methods.settings.identity import Identity

    ctx = SimpleNamespace(model="tiny:llama", model_dtype="bfloat16",
                          device=torch.device("cuda", 1))
    _, _, launch = kvbench_server(ctx, implementation(Identity()), ServeOptions())
    command = launch(8000).command
    assert command[command.index("--device") + 1] == "cuda:1"  # not cuda: cuda:0's
