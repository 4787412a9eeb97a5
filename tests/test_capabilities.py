"""A suite that asks a method for something it does not support is refused when it is loaded,
at the line of the setting that asks; what methods declare is what they do."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from kvbench.methods.settings.base import Capabilities, build_method
from kvbench.methods.settings.identity import Identity
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite

SUITE = """\
kvbench: 1
name: caps
defaults: {{model: "tiny:llama", device: {device}}}
methods:
  - {{name: kivi}}
  - {{name: identity}}
  - {{name: am_task, params: {{tau: 1.0}}}}
  - {{name: am_task, label: am_task-half, params: {{ratio: 0.5}}}}
benchmarks:
  - kind: parity
    params: {{context: 40, steps: 4}}
    matrix: {{trim: [0, 8]}}
  - kind: perplexity
    params:
      context: 40
      continuation: 16
      decode_chunk: 4
"""


def _load(tmp_path: Path, device: str = "cpu"):
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.format(device=device))
    return path, load_suite(path)


def test_unsupported_settings_are_refused_at_their_line(tmp_path):
    with pytest.raises(SuiteError) as caught:
        _load(tmp_path)
    found = {(issue.line, issue.message.split(",")[0]) for issue in caught.value.issues}
    lines = SUITE.splitlines()
    trim = next(i for i, line in enumerate(lines, 1) if "trim: [0, 8]" in line)
    chunk = next(i for i, line in enumerate(lines, 1) if "decode_chunk: 4" in line)
    # kivi packs what it holds: it cannot take 8 tokens back (line of `trim: [0, 8]`)
    assert any(line == trim and "'kivi' does not support 'trim'" in message
               for line, message in found), found
    # am_task by the MAD threshold keeps a different count per layer: one-token steps only
    assert any(line == chunk and "'am_task' does not support 'decode_chunk'" in message
               for line, message in found), found
    messages = " ".join(issue.message for issue in caught.value.issues)
    assert "'identity'" not in messages and "am_task-half" not in messages
    assert "which trim: 8 needs" in messages and "which decode_chunk: 4 needs" in messages


def test_capabilities_follow_the_configuration():
    assert build_method("identity").supports().trim
    assert not build_method("identity", {"dtype": "float16"}).supports().trim
    assert build_method("am", {"ratio": 0.5, "queries": "repeat"}).supports().probes
    assert not build_method("am", {"ratio": 0.5}).supports().probes
    wrapped = build_method("sparse_v", {"base": "am_task", "base_params": {"tau": 1.0}})
    assert not wrapped.supports().decode_chunk and wrapped.supports().trim


def test_evicting_every_chunk_takes_nothing_back(tmp_path):
    """Tokens go while the prompt is fed, so a probe or a trim cannot be taken back after it."""
    path = tmp_path / "suite.yaml"
    path.write_text("""kvbench: 1
defaults: {model: "tiny:llama"}
methods:
  - {name: snapkv, params: {budget: 8, window: 4}}
  - {name: h2o, label: h2o-chunks, params: {budget: 8, evict: every_chunk}}
benchmarks:
  - kind: parity
    params: {context: 40, steps: 4, trim: 8}
""")
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    (issue,) = caught.value.issues
    assert "'h2o-chunks' does not support 'trim', which trim: 8 needs" in issue.message
    assert issue.line == 8


@dataclass
class CpuOnly(Identity):
    """A plug-in whose caches run on the CPU only."""

    capabilities: ClassVar[Capabilities] = Capabilities(devices=("cpu",))

    def supports(self) -> Capabilities:
        return self.capabilities


def test_a_device_the_method_does_not_run_on_is_refused(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(f"""kvbench: 1
defaults: {{model: "tiny:llama", device: cuda}}
methods: [{{name: identity}}, {{name: "{__name__}:CpuOnly"}}]
benchmarks:
  - kind: parity
""")
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    (issue,) = [i for i in caught.value.issues if "does not support" in i.message]
    assert "'CpuOnly' does not support 'cuda', which device: cuda needs" in issue.message
    assert issue.line == 5  # the benchmark that would run it there


def test_a_method_that_cannot_hold_the_head_dim_is_refused_at_its_setting(tmp_path):
    """turbo's default block of 128 on the bundled model (head_dim 64), or on proofs' synthetic
    vectors of dim 32, failed every case at run time; validation now names the setting."""
    path = tmp_path / "suite.yaml"
    path.write_text("""kvbench: 1
defaults: {model: "bundled:smollm2-135m"}
methods:
  - {name: turbo3}
  - {name: turbo, label: turbo-64, params: {bits: 3, block: 64}}
  - {name: sparse_v, params: {base: turbo3}}
benchmarks:
  - kind: perplexity
  - kind: proofs
    params: {dim: 32}
""")
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    found = sorted((issue.line, issue.message) for issue in caught.value.issues)
    assert found == [
        (4, "method 'turbo3': block 128 does not divide head_dim 32: set block to a divisor of"
            " it (e.g. 32) (head_dim 32 in benchmark 'proofs')"),
        (4, "method 'turbo3': block 128 does not divide head_dim 64: set block to a divisor of"
            " it (e.g. 64) (head_dim 64 in benchmark 'perplexity')"),
        (5, "method 'turbo-64': block 64 does not divide head_dim 32: set block to a divisor of"
            " it (e.g. 32) (head_dim 32 in benchmark 'proofs')"),
        (6, "method 'sparse_v': base 'turbo3': block 128 does not divide head_dim 32: set block"
            " to a divisor of it (e.g. 32) (head_dim 32 in benchmark 'proofs')"),
        (6, "method 'sparse_v': base 'turbo3': block 128 does not divide head_dim 64: set block"
            " to a divisor of it (e.g. 64) (head_dim 64 in benchmark 'perplexity')"),
    ]
