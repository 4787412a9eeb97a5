"""The perplexity benchmark and its offline text sources."""
import json
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.base import TextWindowParams
from kvbench.benchmarks.specs.parity import ParityParams
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams, window_offsets
from kvbench.benchmarks.specs.quality import QualityParams
from kvbench.config.fields import SettingError
from kvbench.data.text import load_text, pydoc_text, tokens_sha256
from kvbench.judge.paired import compare_paired
from kvbench.methods import OnBackend, implementation
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.core.contracts import Codec, Implementation, Packed
from kvbench.methods.settings.base import MethodSettings
from kvbench.methods.settings.identity import Identity
from kvbench.methods.settings.sparse_v import SparseV
from kvbench.models.budgets import MAX_CHUNK
from kvbench.models.info import ModelInfo
from kvbench.models.session import TorchSession, prefill
from tests.plugins.model_runs import cpu_context

# Metrics reported only with windows >= 2, and only by methods with sparse-V.
OVER_WINDOWS = {"ppl_rel_delta_ci_low", "ppl_rel_delta_ci_high"}
SPARSE_V = {"values_skipped", "sparse_v_output_error"}


@dataclass
class _Plain(MethodSettings):
    """Settings with no fields, for the hand-written implementations below."""


class TernaryCodec(Codec):
    """Each value becomes -1, 0 or +1 times its vector's max |x|: lossy enough to show."""

    def encode(self, x):
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-8)
        q = torch.round(x / scale).to(torch.int8)
        return Packed({"q": q, "scale": scale.half()}, tuple(x.shape), x.dtype)

    def decode(self, packed):
        return (packed.tensors["q"].float() * packed.tensors["scale"].float()).to(packed.dtype)


class Ternary(Implementation):
    def __init__(self):
        super().__init__(_Plain(), OnBackend("torch"))

    def codec(self):
        return TernaryCodec()

    def new_layer_cache(self, layer_idx):
        return CodecCache(TernaryCodec(), TernaryCodec(), 0, self.on.arrays)


class Leaky(Implementation):
    """Scales stored values by how many caches it has made: state leaking between runs."""

    def __init__(self):
        super().__init__(_Plain(), OnBackend("torch"))
        self.made = 0

    def new_layer_cache(self, layer_idx):
        self.made += 1
        return CodecCache(_Scale(1 + 0.05 * self.made), _Scale(1 + 0.05 * self.made), 0,
                          self.on.arrays)


class _Scale(Codec):
    def __init__(self, factor):
        self.factor = factor

    def encode(self, x):
        return Packed({"x": x * self.factor}, tuple(x.shape), x.dtype)

    def decode(self, packed):
        return packed.tensors["x"]


def _run(method, model="tiny:llama", repeats=1, ctx=None, **params):
    """Perplexity on a tiny model; `method` is settings (run as their torch implementation) or
    an implementation; `ctx` a context to share between runs (its memo)."""
    params = {"context": 48, "continuation": 16, **params}
    if isinstance(method, MethodSettings):
        method = implementation(method)
    return measurement(Perplexity).run(PerplexityParams(**params), method,
                                       ctx or cpu_context(model, repeats))


@pytest.fixture
def fed(monkeypatch):
    """Every forward step of the torch session, as (the cache's class, tokens fed)."""
    steps, real = [], TorchSession.step

    def recording(self, ids, cache, last_only=False):
        steps.append((type(cache).__name__, len(ids)))
        return real(self, ids, cache, last_only)

    monkeypatch.setattr(TorchSession, "step", recording)
    return steps


# --- parameters and check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value", [("context", 0), ("continuation", 1), ("decode_chunk", 0), ("offset", -1)]
)
def test_params_out_of_range_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be >="):
        PerplexityParams(**{field: value})


def test_params_refuse_a_malformed_hf_source():
    with pytest.raises(ValueError, match="hf:<dataset>"):
        PerplexityParams(text="hf:wikitext")


@pytest.mark.parametrize("params", [ParityParams, PerplexityParams, QualityParams])
def test_text_window_params_are_one_base(params):
    """parity, perplexity and quality take text, offset and calibration from one base: the same
    defaults and the same checks, after their own fields' checks."""
    assert issubclass(params, TextWindowParams)
    made = params()
    assert (made.text, made.offset, made.calibration) == ("pydoc", 0, 512)
    for field in ("offset", "calibration"):
        with pytest.raises(ValueError, match=f"^{field} must be >= 0, got -1"):
            params(**{field: -1})
    with pytest.raises(ValueError, match="hf:<dataset>"):
        params(text="hf:wikitext")
    with pytest.raises(ValueError, match="^context must be >= 1"):
        params(context=0, offset=-1)


def test_check_refuses_more_tokens_than_the_model_is_good_for():
    info = ModelInfo("bundled:smollm2-135m", 8192)
    Perplexity().check(PerplexityParams(context=8000, continuation=192), info)  # exactly the limit
    with pytest.raises(ValueError, match=r"8000 \+ 256 = 8256 .*8192.*bundled:smollm2-135m"):
        Perplexity().check(PerplexityParams(context=8000, continuation=256), info)
    with pytest.raises(ValueError, match="needs a model"):
        Perplexity().check(PerplexityParams(), None)


# --- the benchmark on tiny models -------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny:llama", "tiny:qwen3"])
@pytest.mark.parametrize("chunk", [1, 5])
def test_identity_reproduces_the_plain_model(model, chunk):
    out = _run(Identity(), model=model, decode_chunk=chunk)
    ppl, ref = out.metrics["perplexity"].value, out.metrics["ppl_reference"].value
    assert math.isclose(ppl, ref, rel_tol=1e-4)
    assert abs(out.metrics["ppl_rel_delta"].value) < 1e-4
    assert 1 < ref < 1e4


def test_reference_matches_a_full_forward_without_cache(tiny_llama):
    tokens = tiny_llama.tokenizer.encode(pydoc_text())[:64]
    with torch.inference_mode():
        logits = tiny_llama.model(torch.tensor([tokens])).logits[0, 47:63]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(tokens[48:64]))
    out = _run(Identity())
    assert math.isclose(out.metrics["ppl_reference"].value, math.exp(nll.item()), rel_tol=1e-4)


def test_a_lossy_codec_changes_perplexity_and_saves_bytes():
    identity, lossy = _run(Identity()), _run(Ternary())
    assert identity.metrics["ppl_reference"].value == lossy.metrics["ppl_reference"].value
    assert abs(lossy.metrics["ppl_rel_delta"].value) > 1e-2
    assert lossy.metrics["kv_bytes"].value < identity.metrics["kv_bytes"].value / 3
    # 63 tokens fed, 2 layers, K+V, 2 heads: int8 per value plus an fp16 scale per vector
    assert lossy.metrics["kv_bytes"].value == 63 * 2 * 2 * 2 * (16 + 2)
    assert lossy.metrics["compression_ratio"].value == pytest.approx(32 / 18)
    assert lossy.metrics["retained_kv"].value == pytest.approx(18 / 64)  # vs float32
    assert lossy.info["layout"] == "TernaryCodec; K and V both counted"


def test_identity_accounting_and_records(tiny_llama):
    out = _run(Identity(), repeats=3, time_against_plain=True)
    fp32_bytes = 63 * 2 * 2 * 2 * 16 * 4
    assert out.metrics["kv_bytes"].value == fp32_bytes
    assert out.metrics["kv_bytes_measured"].value == fp32_bytes
    assert out.metrics["compression_ratio"].value == 0.5  # fp32 storage is twice 16-bit
    assert out.metrics["retained_kv"].value == 1  # against the plain cache, same dtype
    assert len(out.metrics["prefill_s"].samples) == 3
    assert len(out.metrics["prefill_s_vs_plain"].samples) == 3
    # 15 decode steps: one segment of timings per repeat
    assert len(out.metrics["decode_tok_s"].samples) == 3
    assert len(out.metrics["decode_tok_s_vs_plain"].samples) == 3
    assert {out.metrics[name].timing for name in ("prefill_s", "decode_tok_s")} == {"absolute"}
    assert {out.metrics[name].timing for name in ("prefill_s_vs_plain",
                                                  "decode_tok_s_vs_plain")} == {"ratio"}
    assert out.metrics["perplexity"].samples is None
    assert out.info["peak_memory_bytes"] > 2 * fp32_bytes  # process RSS on CPU: the model too
    assert out.info["peak_memory"].startswith("process resident high-water mark")
    del out.info["peak_memory_bytes"], out.info["peak_memory"]
    (window,) = out.info.pop("windows")
    assert window["offset"] == 0 and window["nll"] == window["nll_plain"]
    assert out.info == {"layout": "identity (auto); K and V both counted", "tokens": 64,
                        "text": "pydoc", "prefill_chunk": MAX_CHUNK}  # the tiny model's within the cap
    tokens = tiny_llama.tokenizer.encode(pydoc_text())[:64]
    assert out.comparable == {"tokens_sha256": tokens_sha256(tokens), "model": "tiny:llama",
                              "model_dtype": "float32"}
    assert set(out.metrics) == set(Perplexity.metrics) - OVER_WINDOWS - SPARSE_V


def test_sparse_v_reports_what_it_skipped():
    dense = _run(Identity())
    exact = _run(SparseV(tau=1e-30))
    sparse = _run(SparseV(tau=0.02))
    assert exact.metrics["values_skipped"].value == 0
    assert exact.metrics["perplexity"].value == pytest.approx(dense.metrics["perplexity"].value,
                                                              rel=1e-5)
    assert 0 < sparse.metrics["values_skipped"].value < 1
    assert sparse.metrics["sparse_v_output_error"].value > 0
    assert sparse.metrics["perplexity"].value != dense.metrics["perplexity"].value
    assert sparse.metrics["kv_bytes"].value == dense.metrics["kv_bytes"].value


def test_state_leaking_between_repeats_is_caught():
    with pytest.raises(RuntimeError, match="differs across repeats"):
        _run(Leaky(), repeats=2)


def test_plain_and_method_caches_run_in_lockstep(fed):
    """With time_against_plain, every prefill and decode step feeds the plain cache and then the
    method's, so their speed ratio compares work done moments apart; one timing sample per 16
    decode steps. The shared plain reference is scored first, on its own."""
    out = _run(Ternary(), continuation=40, decode_chunk=2, time_against_plain=True)
    expected_steps = [2] * 19 + [1]  # 39 tokens fed after the prompt, two at a time
    reference = [("DynamicCache", 48)] + [("DynamicCache", n) for n in expected_steps]
    assert fed == reference + [("DynamicCache", 48), ("KVBenchCache", 48)] + [
        (name, n) for n in expected_steps for name in ("DynamicCache", "KVBenchCache")]
    # 20 decode steps: segments of 16 and 4 steps
    assert len(out.metrics["decode_tok_s"].samples) == 2
    assert len(out.metrics["decode_tok_s_vs_plain"].samples) == 2
    assert all(r > 0 for r in out.metrics["decode_tok_s_vs_plain"].samples)


# --- windows, the shared plain reference, lockstep timing only when asked --------------------


def _lockstep_as_before(session, window, context, chunk, method):
    """The protocol before windows, written out here: one window, the plain cache fed in
    lockstep with the method's. ([plain NLL, method NLL], the method's cache)."""
    plain = session.new_cache(None)
    torch.manual_seed(0)
    mine = session.new_cache(method)
    nll = [0.0, 0.0]

    def score(logits, targets):
        return F.cross_entropy(logits.double(), torch.tensor(targets), reduction="sum").item()

    for k, (cache, run_method) in enumerate(((plain, None), (mine, method))):
        logits, _, _ = prefill(session, cache, window[:context], run_method)
        nll[k] = score(logits, window[context : context + 1])
    for start in range(context, len(window) - 1, chunk):
        end = min(start + chunk, len(window) - 1)
        for k, cache in enumerate((plain, mine)):
            nll[k] += score(session.step(window[start:end], cache)[0], window[start + 1 : end + 1])
    return nll, mine


def test_one_window_gives_the_lockstep_protocol_to_the_bit(tiny_llama):
    """windows 1 (the default) reads the same tokens and gives the same figures, bit for bit,
    as the single lockstep pass did, though its plain reference now runs on its own."""
    method = Ternary()
    out = _run(method, decode_chunk=3, offset=100)
    session = TorchSession(tiny_llama, torch.device("cpu"))
    window = tiny_llama.tokenizer.encode(pydoc_text())[100:164]
    (plain, mine), cache = _lockstep_as_before(session, window, 48, 3, method)
    ppl, reference = math.exp(mine / 16), math.exp(plain / 16)
    bytes_16bit = 63 * 2 * 2 * 2 * 16 * 2
    assert {name: out.metrics[name].value for name in (
        "perplexity", "ppl_reference", "ppl_rel_delta", "kv_bytes", "compression_ratio")} == {
        "perplexity": ppl, "ppl_reference": reference,
        "ppl_rel_delta": (ppl - reference) / reference,
        "kv_bytes": cache.accounted_bytes(),
        "compression_ratio": bytes_16bit / cache.accounted_bytes()}
    assert out.comparable["tokens_sha256"] == tokens_sha256(window)
    assert not OVER_WINDOWS & set(out.metrics)


def test_windows_pool_their_nll_and_pair_with_the_plain_reference():
    out = _run(Ternary(), windows=3)
    windows = out.info["windows"]
    assert len(windows) == 3
    offsets = [w["offset"] for w in windows]
    assert all(b - a >= 64 for a, b in zip(offsets, offsets[1:]))  # in order, apart
    assert out.metrics["perplexity"].value == pytest.approx(
        math.exp(sum(w["nll"] for w in windows) / (3 * 16)), rel=1e-12)
    assert out.metrics["ppl_reference"].value == pytest.approx(
        math.exp(sum(w["nll_plain"] for w in windows) / (3 * 16)), rel=1e-12)
    # each window scores as it would alone: the same tokens, the same NLL
    alone = _run(Ternary(), offset=offsets[1])
    assert alone.info["windows"][0]["nll"] == windows[1]["nll"]
    assert alone.info["windows"][0]["nll_plain"] == windows[1]["nll_plain"]
    # the verdict and the intervals are the per-window values' (the report can re-render)
    paired = compare_paired([w["nll"] / 16 for w in windows],
                            [w["nll_plain"] / 16 for w in windows], higher_is_better=False)
    assert out.info["vs_plain"]["verdict"] == paired.verdict
    assert out.info["vs_plain"]["p_value"] == paired.p_value
    assert out.metrics["ppl_rel_delta_ci_low"].value == math.expm1(paired.low)
    assert out.metrics["ppl_rel_delta_ci_high"].value == math.expm1(paired.high)
    low, high = out.info["perplexity_interval"]
    per_window = [math.exp(w["nll"] / 16) for w in windows]
    # a bootstrap of the windows' mean: within their range (to the rounding of a mean)
    assert min(per_window) * (1 - 1e-12) <= low < high <= max(per_window) * (1 + 1e-12)


def test_identity_over_windows_is_not_separated_from_the_plain_reference():
    out = _run(Identity(), windows=3)
    assert out.metrics["ppl_rel_delta_ci_low"].value == 0
    assert out.metrics["ppl_rel_delta_ci_high"].value == 0
    assert {k: out.info["vs_plain"][k] for k in ("pairs", "wins", "losses", "p_value",
                                                 "verdict")} == {
        "pairs": 3, "wins": 0, "losses": 0, "p_value": 1.0, "verdict": "not separated"}


def test_the_plain_reference_is_scored_once_per_run_and_never_timed_unless_asked(fed):
    """Two methods in one run (one memo) share the plain reference, scored once per window;
    without time_against_plain no plain cache runs beside the method's and the speed ratios
    are not reported. Another run scores its own."""
    ctx = cpu_context("tiny:llama")
    first = _run(Identity(), ctx=ctx, windows=2)
    plain_steps = [step for step in fed if step[0] == "DynamicCache"]
    assert len(plain_steps) == 2 * 16  # per window: the prefill and 15 decode steps
    fed.clear()
    second = _run(Ternary(), ctx=ctx, windows=2)
    assert {name for name, _ in fed} == {"KVBenchCache"}
    assert second.info["windows"][0]["nll_plain"] == first.info["windows"][0]["nll_plain"]
    for out in (first, second):
        assert not {"prefill_s_vs_plain", "decode_tok_s_vs_plain"} & set(out.metrics)
    fed.clear()
    _run(Ternary(), windows=2)
    assert len([step for step in fed if step[0] == "DynamicCache"]) == 2 * 16


def test_window_offsets_are_drawn_with_the_seed():
    params = PerplexityParams(context=100, continuation=28, windows=5, offset=10, calibration=50)
    offsets = window_offsets(params, 2000, seed=0)
    assert offsets == window_offsets(params, 2000, seed=0)
    assert offsets != window_offsets(params, 2000, seed=1)
    assert offsets[0] >= 10 and offsets[-1] + 128 + 50 <= 2000
    assert all(b - a >= 128 for a, b in zip(offsets, offsets[1:]))
    # exactly room for them: one way to place them, whatever the seed
    assert window_offsets(params, 10 + 5 * 128 + 50, seed=3) == [10 + i * 128 for i in range(5)]
    assert window_offsets(PerplexityParams(offset=7), 10, seed=3) == [7]  # one: at offset


def test_windows_that_do_not_fit_the_text_are_refused_before_any_work(fed):
    params = PerplexityParams(context=100, continuation=28, windows=5, calibration=50)
    with pytest.raises(SettingError, match=r"^windows: 5 windows .* room for 4 windows") as caught:
        window_offsets(params, 5 * 128 + 49, seed=0)
    assert caught.value.fields == ("windows",)
    with pytest.raises(SettingError, match="^windows: "):
        _run(Identity(), windows=10_000)
    assert fed == []  # nothing reached the model


def test_progress_is_reported():
    seen = []
    params = PerplexityParams(context=8, continuation=4)
    measurement(Perplexity).run(params, implementation(Identity()),
                                cpu_context("tiny:llama", status=seen.append))
    assert seen[-4:] == ["prefill", "decode 1/3", "decode 2/3", "decode 3/3"]


def test_text_too_short_for_the_window():
    with pytest.raises(ValueError, match="= 10000064"):
        _run(Identity(), offset=10_000_000)


def test_a_text_file_is_scored(tmp_path):
    path = tmp_path / "story.txt"
    path.write_text("once upon a time " * 20)
    out = _run(Identity(), text=str(path), context=16, continuation=8)
    assert out.info["text"] == str(path)
    assert out.metrics["ppl_reference"].value > 1


# --- text sources -----------------------------------------------------------------------------


def test_pydoc_text_is_the_topics_in_key_order():
    from pydoc_data.topics import topics

    text = pydoc_text()
    first, second = sorted(topics)[:2]
    assert text.startswith(topics[first] + "\n\n" + topics[second])
    assert load_text("pydoc") == text


def test_load_text_file_relative_to_base_dir(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    assert load_text("a.txt", tmp_path) == "hello"
    with pytest.raises(ValueError, match="does not exist"):
        load_text("missing.txt", tmp_path)


def test_hf_text_comes_from_the_hub(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    from tests.plugins.hub_standin import HubStandIn, point_kvbench_at

    rows = [{"text": "first page"}, {"text": "second page"}]
    with HubStandIn() as hub:
        point_kvbench_at(hub, monkeypatch, tmp_path / "hf-cache")
        hub.add_dataset("kvbench-test/pages", {
            "train.jsonl": "\n".join(json.dumps(row) for row in rows).encode()})
        assert load_text("hf:kvbench-test/pages:train:text") == "first page\n\nsecond page"
        with pytest.raises(ValueError, match="no column 'body'; columns: \\['text'\\]"):
            load_text("hf:kvbench-test/pages:train:body")
        with pytest.raises(ValueError, match="kvbench-test/no-such: no such repository"):
            load_text("hf:kvbench-test/no-such:train:text")


def test_tokens_sha256_identifies_the_sequence():
    assert tokens_sha256([1, 2, 3]) == tokens_sha256([1, 2, 3])
    assert tokens_sha256([1, 2, 3]) != tokens_sha256([1, 23])
    assert len(tokens_sha256([])) == 64


# --- the bundled model ------------------------------------------------------------------------


@pytest.mark.model
def test_bundled_identity_parity(bundled):
    ctx = cpu_context(loaded=bundled)
    out = measurement(Perplexity).run(PerplexityParams(context=128, continuation=32),
                                      implementation(Identity()), ctx)
    ppl, ref = out.metrics["perplexity"].value, out.metrics["ppl_reference"].value
    assert math.isclose(ppl, ref, rel_tol=1e-4)
    assert 1.5 < ref < 100  # a real model on English text, not a random one
    assert out.metrics["kv_bytes"].value == 159 * 30 * 2 * 3 * 64 * 4


@pytest.mark.slow
@pytest.mark.model
def test_bundled_intq_two_bits_changes_perplexity_eight_bits_barely(bundled):
    from kvbench.methods.settings.intq import IntQ

    ctx = cpu_context(loaded=bundled)
    params = PerplexityParams(context=128, continuation=32)
    perplexity = measurement(Perplexity)
    two = perplexity.run(params, implementation(IntQ(bits=2)), ctx).metrics
    eight = perplexity.run(params, implementation(IntQ(bits=8)), ctx).metrics
    assert two["ppl_rel_delta"].value > 0.05
    assert abs(eight["ppl_rel_delta"].value) < 0.01
    # 2-bit codes + fp16 scale and min per 32 values: 3 bits per value against 16
    assert math.isclose(two["compression_ratio"].value, 16 / 3, rel_tol=1e-9)


@pytest.mark.slow
@pytest.mark.model
def test_bundled_two_bit_cache_is_separated_from_identity_over_windows(bundled):
    """Six windows, every one worse through a 2-bit cache: the sign test's smallest p at six
    (2 / 2**6), and an interval above zero."""
    from kvbench.methods.settings.intq import IntQ

    params = PerplexityParams(context=64, continuation=16, windows=6)
    out = measurement(Perplexity).run(params, implementation(IntQ(bits=2)),
                                      cpu_context(loaded=bundled))
    paired = out.info["vs_plain"]
    assert (paired["verdict"], paired["wins"], paired["p_value"]) == ("worse", 6, 2 / 2**6)
    assert 0 < out.metrics["ppl_rel_delta_ci_low"].value < out.metrics["ppl_rel_delta"].value
