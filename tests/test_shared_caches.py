"""Models whose layers do not each own one cache, on tiny checkpoints built from transformers'
own config classes (kvbench.models.tiny_configs): layers that reuse an earlier layer's K/V
(Gemma 3n), one attention block run at several depths (Zamba 2), a cache class of the model's
own (MiniMax); and configs as transformers writes and reads them (Mamba's infinite
time_step_limit). Identity and KIVI against each model's own attention are in
tests/test_architectures.py; here, what those leave unseen: a reader attending over what its
owner's policy holds (its packed cache, read by the fused decode), each depth's own policy, the
model's own state counted, and refusals in place of tracebacks."""
from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from kvbench.methods import build_method, implementation
from kvbench.models.hf_cache import held_bytes, tensor_bytes, with_cache
from kvbench.models.info import describe_model, method_refusal
from kvbench.models.layer_kinds import FULL, LINEAR, NONE, SLIDING
from kvbench.models.own_cache import plain_cache, unhosted_because
from kvbench.models.session import TorchSession, prefill
from kvbench.models.tiny import build_tiny, tiny_config
from tests.plugins.cli_support import invoke

PROMPT = 40  # past the sliding window (32)
IDS = torch.randint(4, 260, (PROMPT + 6,), generator=torch.Generator().manual_seed(11)).tolist()


def decode(session: TorchSession, settings) -> tuple[torch.Tensor, object]:
    """Every decode step's logits after the prompt, and the cache."""
    method = implementation(settings)
    cache = session.new_cache(method)
    prefill(session, cache, IDS[:PROMPT], method)
    steps = torch.cat([session.step([token], cache)[0] for token in IDS[PROMPT:]])
    return steps, (cache, method)


def test_gemma3n_readers_are_known_from_the_config():
    kinds = describe_model("tiny:gemma3n").layer_kinds
    assert [(k.mixer, k.reads) for k in kinds] == [(SLIDING, None), (FULL, None), (NONE, 0),
                                                    (NONE, 1)]
    assert kinds[3].describe() == "reads layer 1's cache"


@pytest.mark.parametrize("kind", ["gemma3n", "zamba2"])
def test_the_fused_read_reaches_every_layer_that_reads_a_policys_cache(kind, tiny_sessions):
    """intq 2-bit read fused (the packed cache) equals the same codec decoded then attended
    (impl torch) within float rounding: Gemma 3n's reader layers attend over what the owner's
    policy holds, not over the one token its update handed on; Zamba 2's one attention block
    takes each depth's own read."""
    session, logits = tiny_sessions(kind), {}
    for impl in ("auto", "torch"):
        logits[impl], (cache, method) = decode(
            session, build_method("intq", {"bits": 2, "impl": impl}))
        if impl == "auto":
            assert method.impl_log.summary()["decode attention"] == "cpu"
    assert (logits["auto"] - logits["torch"]).abs().max() < 1e-4 * logits["torch"].abs().max()


def test_gemma3n_counts_each_shared_cache_once(tiny_sessions):
    session = tiny_sessions("gemma3n")
    _, (cache, _) = decode(session, build_method("intq", {"bits": 4, "layers": "full"}))
    assert [host.layer_idx for host in cache.hosts] == [1]  # the readers hold nothing
    # the owner keeps its step's read for its reader; a layer nobody reads keeps none (it would
    # hold the step's decoded keys and values)
    assert cache.hosts[0].last_read is not None
    _, (plain_model_cache, _) = decode(tiny_sessions("gemma3"), build_method("intq", {"bits": 4}))
    assert all(host.last_read is None for host in plain_model_cache.hosts)
    assert cache.accounted_bytes() == cache.hosts[0].policy.retained_bytes + tensor_bytes(
        [cache.layers[0].keys, cache.layers[0].values])


def test_zamba2_gives_each_depth_of_the_shared_block_its_own_policy(tiny_sessions):
    session = tiny_sessions("zamba2")
    assert [k.mixer for k in session.layer_kinds] == [LINEAR, "hybrid", LINEAR, "hybrid"]
    _, (cache, _) = decode(session, build_method("intq", {"bits": 4}))
    first, second = (cache.layers[i].policy for i in (1, 3))
    assert first is not second
    assert first.seen_tokens == second.seen_tokens == len(IDS)
    assert first.retained_bytes == second.retained_bytes > 0


def test_minimax_is_hosted_through_its_own_cache_class_and_its_state_counted(tiny_sessions):
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    session = tiny_sessions("minimax")
    _, (cache, _) = decode(session, build_method("intq", {"bits": 4}))
    assert isinstance(cache, MiniMaxCache) and cache.hosts[0].layer_idx == 1
    plain = plain_cache(session.loaded.model)
    session.step(IDS, plain)
    state = tensor_bytes(plain.linear_cache)
    unused = held_bytes(cache.layers[0])  # transformers' layer object for it: a token counter
    assert state > 0 and cache.library_bytes() == state + unused and unused <= 8
    assert cache.accounted_bytes() == cache.policies[0].retained_bytes + state + unused


def test_minimax_decodes_at_the_positions_it_has_seen(tiny_sessions):
    """MiniMax's own cache counts no tokens where its first layer is linear attention (its own
    decode restarts positions at 0): kvbench's positions come from the policies, and its plain
    reference counts what its layers have seen, so both equal the model's own full forward."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    model, _ = build_tiny("minimax", "eager")
    with torch.inference_mode():
        full = model(torch.tensor([IDS])).logits[0, PROMPT:].float()
        rows = {}
        for name, cache in (("own", MiniMaxCache()), ("plain", plain_cache(model))):
            model(torch.tensor([IDS[:PROMPT]]), **with_cache(model, cache))
            rows[name] = torch.cat([model(torch.tensor([[token]]), **with_cache(model, cache))
                                    .logits[0] for token in IDS[PROMPT:-1]]).float()
    mine, _ = decode(tiny_sessions("minimax"), build_method("identity"))
    scale = full.abs().max()
    assert (rows["own"] - full[:-1]).abs().max() > 0.1 * scale  # positions restarted at 0
    assert (rows["plain"] - full[:-1]).abs().max() < 1e-5 * scale
    assert (mine[:-1] - full[:-1]).abs().max() < 1e-5 * scale


def test_a_cache_class_kvbench_does_not_know_is_refused_by_name():
    from transformers.cache_utils import DynamicCache

    module = types.ModuleType("tests_fake_modeling")
    sys.modules[module.__name__] = module
    try:
        exec("class FancyCache(DynamicCache): pass\nclass FancyForCausalLM: pass",
             {"DynamicCache": DynamicCache, "__name__": module.__name__}, vars(module))
        why = unhosted_because(module.FancyForCausalLM)
    finally:
        del sys.modules[module.__name__]
    assert why.startswith("FancyForCausalLM keeps its cache in a class of its own, FancyCache,")


@pytest.mark.parametrize("kind", ["granitemoehybrid", "nemotron_h", "mamba2"])
def test_a_config_with_an_infinite_float_reads_as_transformers_reads_it(kind, tmp_path):
    """transformers writes Mamba's time_step_limit (0, inf) as {"__float__": "Infinity"}."""
    tiny_config(kind).save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    info = describe_model(str(tmp_path))
    assert info.refused is None
    assert [k.mixer for k in info.layer_kinds] == [k.mixer for k in
                                                   describe_model(f"tiny:{kind}").layer_kinds]


def test_a_config_its_own_class_rejects_is_a_refusal_not_a_traceback(tmp_path):
    tiny_config("mamba2").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["time_step_limit"] = [0.0, "lots"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = describe_model(str(tmp_path))
    assert "mamba2 config class cannot read its config.json" in info.refused
    assert "time_step_limit" in info.refused
    assert method_refusal(build_method("identity"), info) == info.refused
    suite = tmp_path / "s.yaml"
    suite.write_text(f"kvbench: 1\nname: t\ndefaults: {{model: {tmp_path}}}\nmethods:\n"
                     "  - name: identity\nbenchmarks:\n  - kind: parity\n")
    result = invoke("validate", suite)
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert "parity/identity:" in result.output and "time_step_limit" in result.output
    result = invoke("models", "inspect", str(tmp_path))
    assert result.exit_code == 0 and "every method refused" in result.output


def test_parity_takes_the_models_own_decode_where_its_full_forward_differs(tiny_sessions):
    """Zamba 2's own full forward and its own decode differ by themselves; the parity session's
    own decode is the model's (eager, its own cache) and identity equals it."""
    session = tiny_sessions("zamba2")
    own = session.own_decode_logits(IDS[:PROMPT], IDS[PROMPT:-1])[1:]
    full = session.own_attention_logits(IDS[:-1], last=len(IDS) - PROMPT)[1:]
    mine, _ = decode(session, build_method("identity"))
    scale = own.abs().max()
    assert (own - full).abs().max() > 1e-3 * scale  # the model's two computations differ
    assert (mine[:-1] - own).abs().max() < 1e-5 * scale


def test_parity_says_how_many_layers_the_method_held(tmp_path):
    """Its layers_compressed: Gemma 3's window held by a quantizer unless layers: full; on
    Zamba 2 the two depths of the shared block; identity's own decode within float rounding
    where its full forward is not."""
    from kvbench import load_suite, run_suite

    suite = tmp_path / "s.yaml"
    suite.write_text(
        "kvbench: 1\nname: t\ndefaults: {device: cpu}\nmethods:\n  - name: identity\n"
        "  - name: intq\n    params: {bits: 4}\n  - name: intq\n    label: intq-full\n"
        "    params: {bits: 4, layers: full}\nbenchmarks:\n"
        "  - kind: parity\n    model: tiny:gemma3\n    params: {context: 40, steps: 3}\n"
        "  - kind: parity\n    model: tiny:zamba2\n    params: {context: 40, steps: 3}\n")
    cases = {case.id: case.metrics for case in
             run_suite(load_suite(suite), tmp_path / "out").result.cases}
    held = {key: metrics["layers_compressed"].value for key, metrics in cases.items()}
    assert held == {"parity/identity@tiny:gemma3": 1, "parity/intq@tiny:gemma3": 2,
                    "parity/intq-full@tiny:gemma3": 1, "parity/identity@tiny:zamba2": 2,
                    "parity/intq@tiny:zamba2": 2, "parity/intq-full@tiny:zamba2": 2}
    zamba = cases["parity/identity@tiny:zamba2"]
    assert zamba["own_decode_max_logit_diff"].value < 1e-4
    assert zamba["own_attention_max_logit_diff"].value > 1e-3
