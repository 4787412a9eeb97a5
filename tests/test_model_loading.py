"""A checkpoint loaded as a user's GPU machine loads it: in the dtype it runs in (never float32
first), auto meaning the checkpoint's own dtype on a GPU and float32 on the CPU; identity equal
to the model's own attention in that dtype; accelerate's device_map; the checkpoint's own code
only under trust_remote_code; the context its rope scaling gives, or the suite's max_context;
the prompt's attention kernel recorded."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvbench.methods import build_method
from kvbench.models.hf_cache import with_cache
from kvbench.models.info import context_limit, describe_model
from kvbench.models.loading import load_model
from kvbench.models.options import LoadOptions, resolved_dtype
from kvbench.models.session import TorchSession
from kvbench.run.runner import run_suite
from kvbench.suite.errors import SuiteError
from kvbench.suite.loader import load_suite
from tests.plugins.checkpoints import save_checkpoint
from tests.plugins.model_runs import session_logits
from tests.plugins.suites import ROOT

PROMPT, STEPS = 40, 8  # past the sliding window (32) of mistral and gemma2
IDS = torch.randint(5, 500, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def bf16_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    return {kind: save_checkpoint(root / kind, kind=kind, dtype=torch.bfloat16)
            for kind in ("llama", "mistral", "gemma2")}


def identity_logits(folder, dtype: str, **options) -> tuple[torch.Tensor, object]:
    """The prompt's last logits and every step's through identity's cache, and the model."""
    loaded = load_model(str(folder), dtype=dtype, options=LoadOptions(**options))
    session = TorchSession(loaded, torch.device("cpu"))
    return session_logits(session, build_method("identity"), IDS, PROMPT)[0], loaded


@torch.inference_mode()
def own_logits(folder, dtype: str, attention: str) -> torch.Tensor:
    """The same through transformers' own model, attention and cache, loaded in `dtype`."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype),
                                                 attn_implementation=attention).eval()
    cache = DynamicCache(config=model.config)
    steps = [model(torch.tensor([IDS[:PROMPT]]), **with_cache(model, cache)).logits[0, -1]]
    for token in IDS[PROMPT:-1]:
        steps.append(model(torch.tensor([[token]]), **with_cache(model, cache)).logits[0, -1])
    return torch.stack(steps).float()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_identity_equals_the_models_own_attention_in_its_dtype(kind, dtype, bf16_checkpoints):
    folder = bf16_checkpoints[kind]
    mine, loaded = identity_logits(folder, dtype)
    assert loaded.dtype == getattr(torch, dtype)
    assert {p.dtype for p in loaded.model.parameters()} == {loaded.dtype}
    if kind != "gemma2":  # transformers has no SDPA path for Gemma 2's softcap
        assert torch.equal(mine, own_logits(folder, dtype, "sdpa"))
    # eager rounds otherwise than SDPA in half precision: within 8 of the dtype's ulps of the
    # largest logit (measured: at most 3.6 in bf16 and 6 in fp16 on these checkpoints)
    eager = own_logits(folder, dtype, "eager")
    assert relative(mine, eager) <= 8 * torch.finfo(getattr(torch, dtype)).eps
    assert torch.equal(mine.argmax(-1), eager.argmax(-1))


def test_auto_is_the_checkpoints_dtype_on_a_gpu_and_float32_on_the_cpu(bf16_checkpoints):
    assert resolved_dtype("auto", "cuda", "bfloat16") == "bfloat16"
    assert resolved_dtype("auto", "mps", "float16") == "float16"
    assert resolved_dtype("auto", "cpu", "bfloat16") == "float32"
    assert resolved_dtype("auto", "cuda", None) == "float32"  # a config that says nothing
    assert resolved_dtype("float16", "cpu", "bfloat16") == "float16"
    assert describe_model(str(bf16_checkpoints["llama"])).dtype == "bfloat16"
    assert load_model(str(bf16_checkpoints["llama"])).dtype == torch.float32


SUITE = """\
kvbench: 1
name: loading
defaults: {{model: "{model}", device: cpu{extra}}}
methods:
  - name: identity
benchmarks:
  - kind: perplexity
    params: {{context: 32, continuation: 8, calibration: 0}}
"""


def _run(tmp_path, model, extra=""):
    folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "suite.yaml").write_text(SUITE.format(model=model, extra=extra))
    result = run_suite(load_suite(folder / "suite.yaml"), folder / "out").result
    assert [c.status for c in result.cases] == ["ok"], [c.error for c in result.cases]
    return result.cases[0]


def test_a_run_records_the_dtype_it_ran_in_and_the_prompts_attention(tmp_path, bf16_checkpoints):
    folder = bf16_checkpoints["llama"]
    auto, half = _run(tmp_path, folder), _run(tmp_path, folder, ", model_dtype: bfloat16")
    assert (auto.model_dtype, half.model_dtype) == ("float32", "bfloat16")
    assert auto.metrics["kv_bytes"].value == 2 * half.metrics["kv_bytes"].value
    assert auto.info["impl"]["prefill_attention"] == "kvbench attention over torch SDPA (cpu)"


def test_device_map_and_max_memory_reach_accelerates_placement(bf16_checkpoints):
    folder = bf16_checkpoints["mistral"]
    placed, _ = identity_logits(folder, "float32", device_map="auto", max_memory={"cpu": "2GiB"})
    assert torch.equal(placed, identity_logits(folder, "float32")[0])
    # a budget below the model's size: accelerate plans it off the CPU (this machine has no GPU)
    starved = load_model(str(folder), options=LoadOptions(device_map="auto",
                                                          max_memory={"cpu": "100KB"}))
    assert set(starved.model.hf_device_map.values()) == {"disk"}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                    reason="reads and resets the peak resident memory through Linux's /proc")
def test_loading_in_bf16_holds_half_the_host_memory_of_a_float32_load(tmp_path):
    """Peak resident memory of loading ~100M parameters saved in bf16, every weight then read:
    a bf16 load (as kvbench now loads one) against a float32 load (what every load was)."""
    save_checkpoint(tmp_path, dtype=torch.bfloat16, hidden_size=1024, intermediate_size=2816,
                    num_hidden_layers=10, num_attention_heads=16, num_key_value_heads=4,
                    head_dim=64)
    # the peak from the load on: imports (torch, a kernel interpreter) may peak higher first
    script = ("import re, sys, torch\n"
              "from kvbench.models.loading import load_model\n"
              "kb = lambda key: int(re.search(key + r':\\s+(\\d+)',"
              " open('/proc/self/status').read())[1])\n"
              "open('/proc/self/clear_refs', 'w').write('5')\n"
              "before = kb('VmRSS')\n"
              "model = load_model(sys.argv[1], dtype=sys.argv[2]).model\n"
              "sum(float(p.float().sum()) for p in model.parameters())\n"
              "print(kb('VmHWM') - before)\n")
    peak = {dtype: int(subprocess.run([sys.executable, "-c", script, str(tmp_path), dtype],
                                      capture_output=True, text=True, check=True,
                                      cwd=ROOT).stdout.split()[-1])
            for dtype in ("bfloat16", "float32")}
    # measured: 251 MB against 668 MB (0.38); the weights are 228 MB in bf16, 455 MB in float32
    assert 0 < peak["bfloat16"] < 0.6 * peak["float32"], peak


QWEN3_CONFIG = {"model_type": "qwen3", "max_position_embeddings": 40960, "hidden_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "num_hidden_layers": 2, "vocab_size": 512, "intermediate_size": 128}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


@pytest.mark.parametrize("config, limit", [
    (QWEN3_CONFIG, 40960),
    ({**QWEN3_CONFIG, "rope_scaling": YARN}, 131072),  # Qwen3's model card
    ({**QWEN3_CONFIG, "rope_parameters": {**YARN, "rope_theta": 1e6}}, 131072),  # transformers 5
    # Llama 3.1: its llama3 scaling states the stretched length as max_position_embeddings
    ({**QWEN3_CONFIG, "max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                       "original_max_position_embeddings": 8192}}, 131072),
    ({**QWEN3_CONFIG, "rope_scaling": {"type": "linear", "factor": 2.0}}, 81920),
])
def test_the_context_limit_is_what_the_rope_scaling_gives(config, limit):
    assert context_limit(config)[0] == limit


def _qwen3_folder(tmp_path, **extra):
    folder = tmp_path / "qwen3"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**QWEN3_CONFIG, **extra}))
    return folder


RULER = """\
kvbench: 1
name: long
defaults: {{model: "{model}", device: cpu{extra}}}
methods:
  - name: identity
benchmarks:
  - kind: ruler
    params: {{length: {length}, task: niah_single_1}}
"""


def _ruler(tmp_path, model, length, extra=""):
    path = tmp_path / "long.yaml"
    path.write_text(RULER.format(model=model, length=length, extra=extra))
    return load_suite(path)


def test_a_context_above_the_limit_is_refused_naming_where_it_comes_from(tmp_path):
    folder = _qwen3_folder(tmp_path)
    with pytest.raises(SuiteError) as refused:
        _ruler(tmp_path, folder, 65536)
    message = " ".join(issue.message for issue in refused.value.issues)
    assert "above the 40960 that model" in message and "max_position_embeddings 40960" in message
    assert "max_context" in message
    # with YaRN in its config, as Qwen3's card says to run 64k-128k
    _qwen3_folder(tmp_path, rope_scaling=YARN)
    assert _ruler(tmp_path, folder, 65536).cases
    with pytest.raises(SuiteError, match="rope scaling yarn x4 over 32768 gives 131072"):
        _ruler(tmp_path, folder, 200000)


def test_max_context_overrides_the_configs_limit(tmp_path):
    folder = _qwen3_folder(tmp_path)
    assert _ruler(tmp_path, folder, 65536, ", max_context: 65536").cases
    with pytest.raises(SuiteError, match="the suite's max_context; its config says 40960"):
        _ruler(tmp_path, folder, 65537, ", max_context: 65536")


CUSTOM_CONFIG = '''\
from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "kvb_tiny_custom"
'''
CUSTOM_MODEL = '''\
from transformers import LlamaForCausalLM

from .configuration_tiny import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
'''


def test_a_checkpoint_with_its_own_code_runs_only_under_trust_remote_code(tmp_path):
    folder = save_checkpoint(tmp_path / "custom")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="kvb_tiny_custom", architectures=["TinyCustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_tiny.TinyCustomConfig",
                            "AutoModelForCausalLM": "modeling_tiny.TinyCustomForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_tiny.py").write_text(CUSTOM_CONFIG)
    (folder / "modeling_tiny.py").write_text(CUSTOM_MODEL)
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE.format(model=folder, extra=""))
    with pytest.raises(SuiteError, match="set trust_remote_code: true if you trust"):
        load_suite(suite)
    case = _run(tmp_path, folder, ", trust_remote_code: true")
    assert type(load_model(str(folder), options=LoadOptions(trust_remote_code=True)).model
                ).__name__ == "TinyCustomForCausalLM"
    assert case.metrics["ppl_rel_delta"].value == 0


def test_an_mlx_quantized_checkpoint_is_refused_on_torch(tmp_path):
    folder = _qwen3_folder(tmp_path, quantization={"group_size": 64, "bits": 4})
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE.format(model=folder, extra=""))
    with pytest.raises(SuiteError, match="quantized by mlx-lm .* backend: mlx"):
        load_suite(suite)
