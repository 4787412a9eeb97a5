"""kvpress presses as kvbench methods (kvbench.methods.external.kvpress) give what kvpress's own
pipeline gives on the same tokens: the same greedy answer, token for token, and the same
perplexity to 1e-4. Runs where the kvpress extra is installed (make test-kvpress); skipped,
naming it, elsewhere."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from kvpress import KVPressTextGenerationPipeline
from transformers import DynamicCache

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.config.fields import SettingError
from kvbench.data.text import token_window
from kvbench.memo import Memo
from kvbench.methods import build_method, implementation
from kvbench.methods.settings.kvpress import KVPress
from kvbench.models.session import prefill
from tests.plugins.model_runs import cpu_context

pytestmark = pytest.mark.model

FACTS = ("The lighthouse keeper on Varn Island was named Odile Brask. She kept a ledger of every"
         " ship that passed, and the ledger said that the schooner Pelican passed on the ninth of"
         " March carrying salt and rope. ")
FILLER = ("The island had no trees, only grass and stones, and the wind came from the west for"
          " most of the year. The keeper walked the cliff path each morning and counted the"
          " gulls. ")
CONTEXT = FILLER * 3 + FACTS + FILLER * 4
QUESTION = "Who was the lighthouse keeper on Varn Island?"

# (press, compression_ratio, other arguments): every press that runs on this CPU with nothing
# downloaded, nested ones written as kvbench's settings write them
PRESSES = [
    ("SnapKVPress", 0.5, {"window_size": 16}),
    ("KnormPress", 0.5, {}),
    ("StreamingLLMPress", 0.5, {}),
    ("LeverageScorePress", 0.5, {}),  # draws a random sketch
    ("BlockPress", None, {"press": {"press": "KnormPress", "compression_ratio": 0.5},
                          "block_size": 64}),
    ("KeyRerotationPress", None, {"press": {"press": "KnormPress", "compression_ratio": 0.5}}),
    ("ComposedPress", None, {"presses": [{"press": "KnormPress", "compression_ratio": 0.25},
                                         {"press": "StreamingLLMPress",
                                          "compression_ratio": 0.25}]}),
    # the rest in the slow run (CI time)
    *(pytest.param(*press, marks=pytest.mark.slow, id=press[0]) for press in [
        ("TOVAPress", 0.5, {}),
        ("ExpectedAttentionPress", 0.5, {}),
        ("KeyDiffPress", 0.5, {}),
        ("LagKVPress", 0.5, {"lag_size": 32}),
        ("RandomPress", 0.5, {"seed": 0}),
        ("CURPress", 0.5, {}),
        ("CompactorPress", 0.5, {}),
        ("NonCausalAttnPress", 0.5, {}),
        ("CapPress", 0.5, {}),
        ("ChunkPress", None, {"press": {"press": "SnapKVPress", "compression_ratio": 0.5,
                                        "window_size": 16}, "chunk_length": 128}),
    ]),
]


def test_a_press_of_ones_own_runs_by_its_module_path(pipeline, bundled_session):
    settings = _settings("tests.plugins.own_press:NewestTokensPress", 0.5, {})
    inputs = pipeline.preprocess(CONTEXT, [QUESTION], answer_prefix="", max_context_length=10**6)
    context_ids = inputs["context_ids"][0].tolist()
    cache = bundled_session.new_cache(implementation(settings))
    prefill(bundled_session, cache, context_ids, implementation(settings))
    kept = int(len(context_ids) * (1 - 0.5))  # kvpress.utils.compute_n_kept
    assert cache.retained_tokens() == [kept] * bundled_session.num_layers
    # the newest tokens, as the press scored them (kvpress keeps them in its top-k's order)
    plain = bundled_session.new_cache(None)
    bundled_session.step(context_ids, plain)
    for layer, policy in zip(plain.layers, cache.policies):
        for head in range(bundled_session.num_kv_heads):
            assert sorted(map(tuple, policy.keys[0, head].tolist())) == \
                sorted(map(tuple, layer.keys[0, head, -kept:].tolist()))


def _settings(press: str, ratio: float | None, args: dict):
    params = {"press": press, "args": args}
    if ratio is not None:
        params["compression_ratio"] = ratio
    return build_method("kvpress", params)


@pytest.fixture(scope="module")
def pipeline(bundled):
    return KVPressTextGenerationPipeline(model=bundled.model, tokenizer=bundled.tokenizer)


@torch.inference_mode()
def _kvbench_answer(session, method, context_ids: list[int], question_ids: list[int],
                    max_new_tokens: int, stop: set[int]) -> tuple[list[int], object]:
    """Greedy tokens through kvbench's session: the context prefilled through the method's
    cache, the question fed in one forward, then one token a step (as the pipeline)."""
    cache = session.new_cache(method)
    prefill(session, cache, context_ids, method)
    logits, _ = session.step(question_ids, cache, last_only=True)
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < max_new_tokens and tokens[-1] not in stop:
        logits, _ = session.step([tokens[-1]], cache, last_only=True)
        tokens.append(int(logits[-1].argmax()))
    return tokens, cache


@pytest.mark.parametrize("press, ratio, args", PRESSES,
                         ids=[p if isinstance(p, str) else p[0] for p in PRESSES])
def test_greedy_answer_is_the_pipelines_token_for_token(pipeline, bundled_session, press, ratio,
                                                        args):
    settings = _settings(press, ratio, args)
    inputs = pipeline.preprocess(CONTEXT, [QUESTION], answer_prefix="", max_context_length=10**6)
    context_ids = inputs["context_ids"][0].tolist()
    question_ids = inputs["questions_ids"][0][0].tolist()
    max_new = 12
    torch.manual_seed(0)  # presses that draw (sketches) draw alike on both sides
    theirs = pipeline(CONTEXT, question=QUESTION, press=settings.build_press(),
                      max_new_tokens=max_new)["answer"]
    stop = pipeline.model.generation_config.eos_token_id
    stop = set(stop if isinstance(stop, list) else [stop])
    method = implementation(settings)
    torch.manual_seed(0)
    ours, cache = _kvbench_answer(bundled_session, method, context_ids, question_ids, max_new,
                                  stop)
    assert bundled_session.tokenizer.decode(ours, skip_special_tokens=True) == theirs
    kept = cache.retained_tokens()
    # the press really removed tokens, and the bytes are those of what it kept
    prompt_and_answer = len(context_ids) + len(question_ids) + len(ours) - 1
    assert max(kept) < prompt_and_answer
    per_token = 2 * bundled_session.num_kv_heads * bundled_session.head_dim * 4
    assert cache.accounted_bytes() == per_token * sum(kept)


@torch.inference_mode()
def _pipeline_perplexity(model, press, window: list[int], context: int) -> float:
    """kvpress's flow: the context through the model under the press over a DynamicCache, then
    the continuation in one forward with positions going on from the context's length (as
    KVPressTextGenerationPipeline feeds a question); the mean NLL of the continuation."""
    cache = DynamicCache()
    ids = torch.tensor([window])
    with press(model):
        first = model(ids[:, :context], past_key_values=cache, use_cache=True,
                      logits_to_keep=1).logits[0, -1]
    positions = torch.arange(context, len(window) - 1).unsqueeze(0)
    rest = model(ids[:, context:-1], past_key_values=cache, position_ids=positions,
                 use_cache=True).logits[0]
    logits = torch.cat([first[None], rest]).double()
    return math.exp(F.cross_entropy(logits, ids[0, context:], reduction="mean").item())


@pytest.mark.parametrize("press, ratio, args", [
    ("SnapKVPress", 0.75, {"window_size": 32, "kernel_size": 7}),
    ("StreamingLLMPress", 0.5, {}),
    pytest.param("KnormPress", 0.5, {}, marks=pytest.mark.slow),
    pytest.param("TOVAPress", 0.5, {}, marks=pytest.mark.slow),
], ids=["SnapKVPress", "StreamingLLMPress", "KnormPress", "TOVAPress"])
def test_perplexity_benchmark_is_the_pipelines_to_1e_4(bundled, bundled_session, press, ratio,
                                                       args):
    settings = _settings(press, ratio, args)
    params = PerplexityParams(context=512, continuation=64)
    result = measurement(Perplexity).run(params, implementation(settings),
                                         cpu_context(loaded=bundled))
    offset = result.info["windows"][0]["offset"]
    window, _ = token_window(Memo(), bundled_session, params.text, offset,
                             params.context + params.continuation)
    theirs = _pipeline_perplexity(bundled.model, settings.build_press(), window, params.context)
    ours = result.metrics["perplexity"].value
    assert ours == pytest.approx(theirs, rel=1e-4)
    # and the press changed the perplexity: the cache it left is what was scored
    assert ours != pytest.approx(result.metrics["ppl_reference"].value, rel=1e-4)
    assert result.metrics["retained_kv"].value < 1


@pytest.mark.parametrize("params, blamed, message", [
    ({"press": "NoSuchPress"}, "press", "kvpress has no press 'NoSuchPress'"),
    ({"press": "AdaKVPress"}, "press", "its cache is not smaller"),
    ({"press": "KVzipPress"}, "press", "its own __call__"),
    ({"press": "PyramidKVPress"}, "press", "layers keep different counts"),
    ({"press": "KnormPress", "args": {"window": 3}}, "args", "KnormPress takes no window"),
    ({"press": "KnormPress", "compression_ratio": 0.5, "args": {"compression_ratio": 0.5}},
     "args", "set twice"),
    ({"press": "BlockPress", "args": {"press": {"press": "Nope"}}}, "args", "no press 'Nope'"),
])
def test_bad_presses_are_refused_naming_the_setting(params, blamed, message):
    with pytest.raises(SettingError, match=message) as refused:
        KVPress(**params)
    assert refused.value.fields == (blamed,)


def test_a_ladder_that_feeds_the_prompt_in_chunks_is_refused_for_a_press(tmp_path):
    from kvbench.suite import load_suite

    suite = tmp_path / "s.yaml"
    suite.write_text(
        "kvbench: 1\nname: s\ndefaults: {model: bundled:smollm2-135m}\n"
        "methods:\n  - {name: kvpress, params: {press: KnormPress, compression_ratio: 0.5}}\n"
        "benchmarks:\n  - kind: ladder\n    params: {length: 2048, prefill_chunk: 1024}\n")
    with pytest.raises(Exception, match="chunked_prefill") as refused:
        load_suite(suite)
    assert "prefill_chunk" in str(refused.value)
