"""Indexed sparse attention (DeepSeek-V3.2's indexer, tiny:deepseek_v32) hosted by kvbench: the
method's policy holds the MLA latent, the indexer's key cache sits beside it
(kvbench.models.indexed_layer), and kvbench's attention folds the indexer's top-k selection into
the mask on every step, one-token steps past index_topk tokens included. Identity is the model's
own eager attention; methods that keep every token compose with the indexer, the others are
refused at validate with the layers and the reason."""
from __future__ import annotations

import pytest
import torch

from kvbench.methods import build_method, implementation
from kvbench.models.info import describe_model, method_refusal
from kvbench.models.layer_kinds import FULL, refusal
from kvbench.models.loading import load_model
from kvbench.models.session import TorchSession, prefill
from kvbench.models.tiny_configs import TINY_CONFIGS
from tests.test_architectures import IDS, PROMPT, eager_logits, method_logits, relative

KIND = "deepseek_v32"
TOPK = TINY_CONFIGS[KIND]["index_topk"]


@pytest.fixture(scope="module")
def session() -> TorchSession:
    return TorchSession(load_model(f"tiny:{KIND}"), torch.device("cpu"))


@pytest.fixture(scope="module")
def eager() -> tuple[torch.Tensor, torch.Tensor]:
    return eager_logits(KIND)


def test_the_layers_are_indexed_mla_and_described():
    kinds = describe_model(f"tiny:{KIND}").layer_kinds
    assert [(k.mixer, k.index_topk, k.mla) for k in kinds] == [(FULL, TOPK, True)] * 2
    assert kinds[0].describe().startswith(f"full attention, the indexer's top {TOPK} keys, MLA")
    assert kinds[0].unfused_because() == "MLA and the indexer's top-k mask"


def test_identity_is_the_models_own_attention_past_the_indexers_top_k(session, eager):
    """Full forward and incremental decode, every decode step past index_topk keys, where the
    selection is the mask."""
    full, incremental = eager
    assert PROMPT > TOPK
    mine, cache = method_logits(session, build_method("identity"))
    assert relative(mine, incremental) <= 1e-5
    one_forward, _ = session.step(IDS, session.new_cache(implementation(build_method("identity"))))
    assert relative(one_forward[PROMPT - 1 : -1], full) <= 1e-5
    # kvbench's attention without a cache (the plain reference) folds the selection too
    assert relative(session.full_logits(IDS, len(IDS))[PROMPT - 1 : -1], full) <= 1e-5
    # the indexer's keys, one per token seen, are the library's bytes
    seen = len(IDS) - 1  # the prompt and every step but the last token
    index_dim = TINY_CONFIGS[KIND]["index_head_dim"]
    assert [tuple(layer.indexer_keys.shape) for layer in cache.layers] == [(1, seen, index_dim)] * 2
    assert cache.library_bytes() == 2 * seen * index_dim * 4
    assert cache.accounted_bytes() == sum(p.retained_bytes for p in cache.policies) + \
        cache.library_bytes()
    assert cache.get_mask_sizes(1, 0) == (seen + 1, 0)  # every key, none dropped


def test_a_prompt_fed_in_chunks_is_the_models_own(session):
    """Chunks after the first (the ladder's prefill_chunk): the mask and the indexer's keys
    span the earlier chunks too."""
    from transformers import DynamicCache

    from kvbench.models.hf_cache import with_cache
    from kvbench.models.tiny import build_tiny

    model, _ = build_tiny(KIND, "eager")
    theirs, cache = [], DynamicCache(config=model.config)
    mine, ours = [], session.new_cache(implementation(build_method("identity")))
    with torch.inference_mode():
        for chunk in (IDS[:15], IDS[15:PROMPT], IDS[PROMPT : PROMPT + 1]):
            theirs.append(model(torch.tensor([chunk]), **with_cache(model, cache)).logits[0])
            mine.append(session.step(chunk, ours)[0])
    assert relative(torch.cat(mine), torch.cat(theirs)) <= 1e-5


def test_the_selection_matters_at_one_token_steps():
    """The same weights with an indexer that selects every key decode otherwise: a decode step
    that dropped the selection would not be the model's own."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from kvbench.models.hf_cache import with_cache
    from kvbench.models.tiny import build_tiny, tiny_config

    model, _ = build_tiny(KIND, "eager")
    config = tiny_config(KIND, "eager")
    config.index_topk = 10**6
    everything = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    everything.load_state_dict(model.state_dict())
    steps = []
    with torch.inference_mode():
        for m in (model, everything):
            cache = DynamicCache(config=m.config)
            m(torch.tensor([IDS[:PROMPT]]), **with_cache(m, cache))
            steps.append(m(torch.tensor([IDS[PROMPT : PROMPT + 1]]),
                           **with_cache(m, cache)).logits[0, -1])
    assert relative(steps[1], steps[0]) > 1e-2


def test_kivi_below_its_residual_is_lossless_and_quantizers_read_what_they_store(session,
                                                                                  eager):
    _, incremental = eager
    mine, cache = method_logits(session, build_method("kivi", {"residual": 128}))
    assert (mine - incremental).abs().max().item() <= 1e-3
    assert len(cache.policies) == 2
    mine, _ = method_logits(session, build_method("intq", {"bits": 2}))
    assert (mine - incremental).abs().max().item() > 1e-3


def test_the_fused_read_is_not_taken_and_impl_says_why(session):
    method = implementation(build_method("intq", {"bits": 4, "impl": "auto"}))
    cache = session.new_cache(method)
    prefill(session, cache, IDS[:PROMPT], method)
    session.step(IDS[PROMPT : PROMPT + 1], cache)
    assert method.impl_log.summary()["decode attention"] == \
        "torch (MLA and the indexer's top-k mask: no fused kernel)"


RUNS = [("identity", {}), ("intq", {"bits": 4}), ("kivi", {"group_size": 8, "residual": 16}),
        ("lloydmax", {}), ("turbo3", {"block": 8}), ("adaptive", {"base_params": {"block": 8}}),
        ("sparse_v", {"base": "turbo3", "base_params": {"block": 8}, "tau": 1e-3}),
        ("decay", {"base_params": {"block": 8}, "window": 8, "segment": 8, "evict_below": 0.0})]
REFUSED = [("streamingllm", {"ratio": 0.5}, "keeps only 0.5 of the prompt"),
           ("snapkv", {"ratio": 0.5, "window": 8}, "keeps only 0.5 of the prompt"),
           ("h2o", {"budget": 9}, "keeps only 9 tokens"),
           ("am", {"ratio": 0.5}, "keeps only 0.5 of the prompt"),
           ("butterfly", {"block_size": 8, "window": 8}, "adds block summaries to the keys"),
           ("decay", {"base_params": {"block": 8}, "window": 8, "segment": 8},
            "evicts the segments scored below 0.1"),
           ("sparse_v", {"base": "am", "base_params": {"ratio": 0.5}},
            "keeps only 0.5 of the prompt")]


@pytest.mark.parametrize("name, params", RUNS, ids=[name for name, _ in RUNS])
def test_methods_that_keep_every_token_run(name, params, session):
    settings = build_method(name, params)
    assert method_refusal(settings, describe_model(f"tiny:{KIND}")) is None
    method = implementation(settings)
    if hasattr(method, "calibrate"):
        session.calibrate(method, IDS[:PROMPT])
    cache = session.new_cache(method)
    prefill(session, cache, IDS[:PROMPT], method)
    for token in IDS[PROMPT : PROMPT + 3]:
        logits, _ = session.step([token], cache)
        assert torch.isfinite(logits).all()
    assert all(policy.retained_tokens == PROMPT + 3 for policy in cache.policies)
    assert cache.library_bytes() > 0


@pytest.mark.parametrize("name, params, why", REFUSED, ids=[n for n, _, _ in REFUSED])
def test_methods_that_move_keys_are_refused_naming_the_layers(name, params, why):
    why_refused = method_refusal(build_method(name, params), describe_model(f"tiny:{KIND}"))
    assert why_refused.startswith(f"layers 0, 1: full attention, the indexer's top {TOPK} keys")
    assert "the indexer selects among every past position" in why_refused and why in why_refused


def test_a_library_cache_and_mlx_are_refused():
    kinds = describe_model(f"tiny:{KIND}").layer_kinds
    assert "a library's own cache" in refusal(build_method("hf-quantized"), kinds)
    assert "on torch only" in refusal(build_method("identity"), kinds, backend="mlx")


def test_a_policy_that_drops_keys_anyway_is_an_error_at_its_step(session):
    """What validation refuses, forced past it: the layer says why instead of attending over
    keys the selection does not index."""
    method = implementation(build_method("streamingllm", {"ratio": 0.5}))
    cache = session.new_cache(method)
    with pytest.raises(RuntimeError, match="must keep every token where it was"):
        prefill(session, cache, IDS[:PROMPT], method)
        session.step(IDS[PROMPT : PROMPT + 1], cache)


def test_taking_tokens_back_takes_the_indexers_keys_back(session):
    method = implementation(build_method("identity"))
    cache = session.new_cache(method)
    session.step(IDS[:PROMPT], cache)
    session.trim(cache, 3)
    assert [layer.indexer_keys.shape[1] for layer in cache.layers] == [PROMPT - 3] * 2
    assert cache.get_seq_length() == PROMPT - 3


def test_selected_mask_is_the_models_own_fold():
    """Bool and additive masks, and a one-token step without one, as DeepseekV32Attention folds
    its indexer's selection for eager and SDPA."""
    from kvbench.models.indexed_layer import selected_mask

    g = torch.Generator().manual_seed(0)
    indices = torch.stack([torch.randperm(9, generator=g)[:4] for _ in range(5)])[None]
    causal = torch.ones(5, 9, dtype=torch.bool).tril(4)[None, None]
    index_mask = torch.ones(1, 5, 9, dtype=torch.bool).scatter(-1, indices, False).unsqueeze(1)
    assert torch.equal(selected_mask(causal, indices.int(), 9), causal & ~index_mask)
    additive = torch.where(causal, 0.0, torch.finfo(torch.float32).min)
    assert torch.equal(selected_mask(additive, indices, 9),
                       additive.masked_fill(index_mask, torch.finfo(torch.float32).min))
    assert torch.equal(selected_mask(None, indices[:, :1], 9), ~index_mask[:, :, :1])
