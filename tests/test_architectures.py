"""Every architecture family users bring, on tiny random-weight checkpoints built from
transformers' own config classes (kvbench.models.tiny_configs): identity equals the model's own
eager attention, full forward and incremental decode; KIVI below its residual is lossless; every
shipped method runs or is refused at validate, with the layers and the reason; the library's own
layers are counted in the bytes."""
from __future__ import annotations

import json

import pytest
import torch

from kvbench.methods import METHODS, build_method, implementation
from kvbench.models.attention import biased_attention
from kvbench.models.hf_cache import held_bytes, with_cache
from kvbench.models.info import describe_model, method_refusal
from kvbench.models.layer_kinds import (FULL, LINEAR, SLIDING, config_layer_kinds,
                                         hosted_layers, refusal)
from kvbench.models.loading import load_model
from kvbench.models.own_cache import plain_cache
from kvbench.models.session import TorchSession, prefill
from kvbench.models.tiny import build_tiny
from kvbench.models.tiny_configs import TINY_CONFIGS, TINY_KINDS, WINDOW
from tests.plugins.cli_support import invoke
from tests.plugins.model_runs import session_logits

PROMPT, STEPS = 40, 8  # the prompt passes the sliding window (32), then one-token steps
IDS = torch.randint(4, 260, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(7)).tolist()


@torch.inference_mode()
def eager_logits(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own attention (eager): (one full forward's logits at the prompt's last
    position and every step's, the same by incremental decode through the model's own cache,
    each step told its position as generate() tells it)."""
    model, _ = build_tiny(kind, "eager")
    full = model(torch.tensor([IDS])).logits[0, PROMPT - 1 : -1].float()
    cache = plain_cache(model)
    steps = [model(torch.tensor([IDS[:PROMPT]]), **with_cache(model, cache)).logits[0, -1]]
    for position, token in enumerate(IDS[PROMPT:-1], start=PROMPT):
        steps.append(model(torch.tensor([[token]]), position_ids=torch.tensor([[position]]),
                           **with_cache(model, cache)).logits[0, -1])
    return full, torch.stack(steps).float()


def method_logits(session: TorchSession, settings) -> tuple[torch.Tensor, object]:
    """The prompt's last logits and every step's through the method's cache."""
    return session_logits(session, settings, IDS, PROMPT)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_identity_equals_the_models_own_eager_attention(kind, tiny_sessions):
    full, incremental = eager_logits(kind)
    mine, _ = method_logits(tiny_sessions(kind), build_method("identity"))
    assert relative(mine, incremental) <= 1e-5
    # A linear-attention layer's full forward (chunked) and its decode (recurrent) differ in
    # rounding by themselves (1.6e-5 on qwen3_5): within that of the full forward.
    assert relative(mine, full) <= max(1e-5, 1.5 * relative(incremental, full))


@pytest.mark.parametrize("kind", [k for k in TINY_KINDS  # those with a layer kivi compresses
                                  if any(kind.compressed for kind in describe_model(
                                      f"tiny:{k}").layer_kinds)])
def test_kivi_below_its_residual_is_lossless(kind, tiny_sessions):
    # against the model's own decode, which the method's run is: an indexer's top-k breaks
    # exact ties (relu scores at 0, frequent with tiny:deepseek_v32's 2 index heads) by the
    # number of keys, so its full forward need not be its own decode
    _, incremental = eager_logits(kind)
    mine, cache = method_logits(tiny_sessions(kind), build_method("kivi", {"residual": 128}))
    assert (mine - incremental).abs().max().item() <= 1e-3
    assert cache.policies  # it compressed (hosted) some layer


@pytest.mark.parametrize("kind", ["gemma3", "gpt_oss", "qwen3_5", "jamba", "deepseek_v3",
                                  "falcon_h1"])
def test_a_lossy_method_reads_what_it_stores_on_every_family(kind, tiny_sessions):
    """intq 2-bit moves the logits on the layers it compresses (attention really reads them)."""
    full, _ = eager_logits(kind)
    mine, cache = method_logits(tiny_sessions(kind), build_method("intq", {"bits": 2}))
    assert (mine - full).abs().max().item() > 1e-3
    # its sliding windows too (layers unset: all; tests/test_sliding_quantizers.py)
    assert len(cache.policies) == len(hosted_layers(cache.method, tiny_sessions(kind).layer_kinds))


def test_the_library_hosts_sliding_and_linear_layers_and_their_bytes_count(tiny_sessions):
    from transformers import DynamicCache

    session = tiny_sessions("qwen3_5")
    assert [k.mixer for k in session.layer_kinds] == [LINEAR, FULL]
    _, cache = method_logits(session, build_method("intq", {"bits": 4}))
    plain = DynamicCache(config=session.loaded.model.config)
    session.step(IDS, plain)
    linear_state = held_bytes(plain.layers[0])
    assert linear_state > 0 and cache.library_bytes() == linear_state
    assert cache.accounted_bytes() == cache.policies[0].retained_bytes + linear_state

    # Falcon-H1: each layer attends (the method's policy) and keeps a Mamba state (the library's)
    session = tiny_sessions("falcon_h1")
    _, cache = method_logits(session, build_method("intq", {"bits": 4}))
    plain = DynamicCache(config=session.loaded.model.config)
    session.step(IDS, plain)
    mamba = sum(held_bytes(layer) - layer.keys.nbytes - layer.values.nbytes
                for layer in plain.layers)
    assert len(cache.policies) == 2 and mamba > 0 and cache.library_bytes() == mamba

    session = tiny_sessions("gemma3")
    _, cache = method_logits(session, build_method("identity"))
    window = cache.layers[0]
    assert window.is_sliding and window.keys.shape[-2] == WINDOW - 1  # transformers' own layer
    assert cache.layers[1].policy.retained_tokens == PROMPT + STEPS - 1


SHIPPED = [name for name in METHODS.names() if not METHODS.get(name).library_cache]


def shipped_settings(name: str):
    return build_method(name, METHODS.get(name).conformance_params[0])


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_every_shipped_method_runs_or_is_refused(kind, tiny_sessions):
    """What refusal() lets through runs (a few steps, every byte counted), on every family."""
    session, info = tiny_sessions(kind), describe_model(f"tiny:{kind}")
    failures = {}
    for name in SHIPPED:
        settings = shipped_settings(name)
        if method_refusal(settings, info):
            continue
        method = implementation(settings)
        if hasattr(method, "calibrate"):
            session.calibrate(method, IDS[:PROMPT])
        cache = session.new_cache(method)
        try:
            prefill(session, cache, IDS[:PROMPT], method)
            for token in IDS[PROMPT : PROMPT + 2]:
                session.step([token], cache)
        except Exception as exc:  # noqa: BLE001 - every failure is listed, not the first
            failures[name] = f"{type(exc).__name__}: {exc}"
            continue
        assert all(policy.retained_bytes > 0 for policy in cache.policies)
        # the library's layers, or the Mamba state beside a hybrid layer's attention, or the
        # indexer's keys beside an indexed layer's
        hosted = hosted_layers(settings, session.layer_kinds)
        library = any(i not in hosted or kind.mixer not in (FULL, SLIDING) or kind.index_topk
                      for i, kind in enumerate(session.layer_kinds))
        assert (cache.library_bytes() > 0) == library
    assert not failures


def test_refusals_name_the_layers_and_the_reason():
    mistral = describe_model("tiny:mistral").layer_kinds
    assert [k.mixer for k in mistral] == [SLIDING, SLIDING]
    assert refusal(build_method("identity"), mistral) is None
    why = refusal(build_method("intq", {"layers": "full"}), mistral)
    assert "every layer is sliding window of 32" in why
    deepseek = describe_model("tiny:deepseek_v3").layer_kinds
    assert "layers 0, 1: full attention, MLA latent of 32" in refusal(build_method("snapkv", {"ratio": 0.5}),
                                                                      deepseek)
    assert refusal(build_method("streamingllm", {"ratio": 0.5}), deepseek) is None
    gemma2 = describe_model("tiny:gemma2").layer_kinds
    assert "layers 0, 1: sliding window of 32, softcap 50" in refusal(
        build_method("hf-quantized"), gemma2)


def test_validate_lists_the_refused_cases_with_the_layers(tmp_path):
    """Refused before any work and recorded as refused with the reason: a suite over several
    models still runs every pair that can run."""
    from kvbench import load_suite

    suite = tmp_path / "s.yaml"
    suite.write_text("kvbench: 1\nname: t\ndefaults: {model: tiny:mistral}\nmethods:\n"
                     "  - name: identity\n  - name: intq\n    params: {layers: full}\n"
                     "benchmarks:\n  - kind: parity\n")
    result = invoke("validate", suite)
    assert result.exit_code == 0
    assert "parity/intq: tiny:mistral: no layer to compress: every layer is sliding window" \
        in " ".join(result.output.split())
    cases = {case.id: case.refused for case in load_suite(suite).cases}
    assert cases["parity/identity"] is None and "sliding window of 32" in cases["parity/intq"]


def test_a_checkpoints_config_json_gives_its_layers(tmp_path):
    """From the config.json a checkpoint folder holds, as validation reads it; and without
    transformers, from the mapping's own layer_types."""
    from kvbench.models.tiny import tiny_config

    tiny_config("gemma3").save_pretrained(tmp_path)
    kinds = describe_model(str(tmp_path)).layer_kinds
    assert [(k.mixer, k.window) for k in kinds] == [(SLIDING, WINDOW), (FULL, None)]
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "not-a-model-transformers-knows"
    assert [(k.mixer, k.window) for k in config_layer_kinds(config)] == [(SLIDING, WINDOW),
                                                                         (FULL, None)]
    # Jamba's layer types come from its period and offset: transformers' class knows them
    assert [k.mixer for k in config_layer_kinds(TINY_CONFIGS["jamba"])] == [LINEAR, FULL]


def test_a_gguf_model_says_what_to_do(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="is a GGUF file.*llama.cpp"):
        describe_model(str(gguf))


def test_models_inspect_prints_the_layers_and_each_methods_verdict():
    result = invoke("models", "inspect", "tiny:gpt_oss")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "sliding window of 32, sinks" in text  # sinks read from the attention modules
    assert "runs, compressing layer 1" in text
    assert "refused" in text  # the libraries' caches


@pytest.mark.parametrize("family", ["gpt_oss", "gemma2"])
def test_sinks_and_softcap_are_the_models_own(family):
    """biased_attention with sinks / softcap equals the family's own eager attention function on
    fresh random inputs (a causal mask included)."""
    import importlib

    module_name = {"gpt_oss": "gpt_oss", "gemma2": "gemma2"}[family]
    eager = importlib.import_module(
        f"transformers.models.{module_name}.modeling_{module_name}").eager_attention_forward
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, t, 16, generator=g) for h, t in ((4, 5), (2, 9), (2, 9)))
    visible = torch.ones(5, 9, dtype=torch.bool).tril(4)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 2, False
    features = {}
    if family == "gpt_oss":
        module.sinks = torch.randn(4, generator=g)
        features["sinks"] = module.sinks
        theirs = eager(module, q, k, v, torch.where(visible, 0.0, float("-inf")), 0.25)[0]
    else:
        features["softcap"] = 5.0
        theirs = eager(module, q, k, v, torch.where(visible, 0.0, float("-inf")), scaling=0.25,
                       softcap=5.0)[0]
    mine = biased_attention(q, k, v, visible, None, 0.25, **features)[0].transpose(1, 2)
    assert torch.allclose(mine, theirs, atol=1e-6)


@pytest.mark.model
def test_a_multimodal_gemma3_checkpoint_runs_its_text_model(tmp_path, bundled):
    """Gemma 3 as its multimodal checkpoints are (Gemma3ForConditionalGeneration, the text
    config under text_config), saved and loaded from its folder with the bundled tokenizer:
    the layers read from text_config, identity equal to the model's own eager attention."""
    import shutil

    from transformers import AutoModelForCausalLM, Gemma3Config, Gemma3ForConditionalGeneration

    from kvbench.models.bundled import prepared_dir

    text = {k: v for k, v in TINY_CONFIGS["gemma3"].items() if k != "model_type"}
    config = Gemma3Config(text_config={**text, "vocab_size": bundled.tokenizer.vocab_size + 300},
                          vision_config=dict(hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             image_size=28, patch_size=14),
                          mm_tokens_per_image=4)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Gemma3ForConditionalGeneration(config).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(prepared_dir("smollm2-135m", print) / name, tmp_path)
    assert [(k.mixer, k.window) for k in describe_model(str(tmp_path)).layer_kinds] == \
        [(SLIDING, WINDOW), (FULL, None)]
    session = TorchSession(load_model(str(tmp_path)), torch.device("cpu"))
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.inference_mode():
        full = eager(torch.tensor([IDS])).logits[0, PROMPT - 1 : -1].float()
    mine, cache = method_logits(session, build_method("identity"))
    assert relative(mine, full) <= 1e-5 and cache.layers[0].is_sliding


@pytest.mark.parametrize("kind", ["gemma3", "qwen3_5"])
def test_the_server_answers_on_a_family_with_library_layers(kind, tiny_sessions):
    """kvbench serve's engine on a model whose window or state the library holds: each request
    decoded one row at a time gives what it gives alone, batched or not."""
    from tests.plugins.model_runs import staggered_prompts
    from tests.test_serve import generate

    from kvbench.serve.engine import Engine, Finished

    session = tiny_sessions(kind)
    prompts = staggered_prompts(session.tokenizer)[:3]
    engine = Engine(session, implementation(build_method("intq", {"bits": 4})))
    engine.start()
    try:
        alone = generate(engine, prompts, 6, together=False)
        together = generate(engine, prompts, 6, together=True)
    finally:
        engine.stop()
    assert [o.end for o in alone] == [Finished("length", len(p), 6) for p in prompts]
    assert [o.tokens for o in together] == [o.tokens for o in alone]


@pytest.mark.parametrize("kind, fused", [("gemma2", "cpu"), ("gpt_oss", "cpu"), ("llama", "cpu"),
                                         ("deepseek_v3", "torch (MLA: no fused kernel)")])
def test_the_fused_read_takes_softcap_and_sinks_and_impl_says_where_it_is_not_taken(
        kind, fused, tiny_sessions):
    """Gemma 2's softcap and gpt-oss's sinks are computed by the fused read itself: a decode
    step's logits are the reference path's (decode, then attention with the same softcap and
    sinks) within float32 rounding; MLA's latent keys are not read fused, and info.impl says
    so."""
    session, logits = tiny_sessions(kind), {}
    for impl in ("auto", "torch"):
        method = implementation(build_method("intq", {"bits": 4, "impl": impl}))
        cache = session.new_cache(method)
        prefill(session, cache, IDS[:PROMPT], method)
        logits[impl] = torch.cat([session.step([token], cache)[0]
                                  for token in IDS[PROMPT : PROMPT + 3]])
        if impl == "auto":
            assert method.impl_log.summary()["decode attention"] == fused
    scale = logits["torch"].abs().max()
    assert (logits["auto"] - logits["torch"]).abs().max() < 1e-5 * scale


@pytest.mark.parametrize("kind", ["gemma2", "gpt_oss"])
def test_a_read_held_for_kvbench_attention_keeps_the_softcap_and_sinks(kind, tiny_sessions):
    """A policy whose read kvbench's attention takes (sparse-V, here skipping nothing) attends
    with the model's softcap and sinks as the plain read does: identity's logits."""
    session, logits = tiny_sessions(kind), []
    for name, params in (("identity", {}), ("sparse_v", {"base": "identity", "tau": 1e-30})):
        method = implementation(build_method(name, params))
        cache = session.new_cache(method)
        prefill(session, cache, IDS[:PROMPT], method)
        logits.append(torch.cat([session.step([token], cache)[0]
                                 for token in IDS[PROMPT : PROMPT + 3]]))
    assert (logits[0] - logits[1]).abs().max() < 1e-5 * logits[0].abs().max()
