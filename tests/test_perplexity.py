"""The perplexity benchmark and its offline text sources."""
import math
from dataclasses import dataclass

import pytest
import torch

from kvbench.benchmarks import measurement
from kvbench.benchmarks.specs.base import TextWindowParams
from kvbench.benchmarks.specs.parity import ParityParams
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.benchmarks.specs.quality import QualityParams
from kvbench.data.text import load_text, pydoc_text, tokens_sha256
from kvbench.methods import OnBackend, implementation
from kvbench.methods.core.codec_cache import CodecCache
from kvbench.methods.core.contracts import Codec, Implementation, Packed
from kvbench.methods.settings.base import MethodSettings
from kvbench.methods.settings.identity import Identity
from kvbench.methods.settings.sparse_v import SparseV
from kvbench.models.info import ModelInfo
from tests.plugins.model_runs import cpu_context


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


def _run(method, model="tiny:llama", repeats=1, **params):
    """Perplexity on a tiny model; `method` is settings (run as their torch implementation) or
    an implementation."""
    params = {"context": 48, "continuation": 16, **params}
    if isinstance(method, MethodSettings):
        method = implementation(method)
    return measurement(Perplexity).run(PerplexityParams(**params), method,
                                       cpu_context(model, repeats))


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
    out = _run(Identity(), repeats=3)
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
    assert out.info == {"layout": "identity (auto); K and V both counted", "tokens": 64, "text": "pydoc"}
    tokens = tiny_llama.tokenizer.encode(pydoc_text())[:64]
    assert out.comparable == {"tokens_sha256": tokens_sha256(tokens), "model": "tiny:llama",
                              "model_dtype": "float32"}
    assert set(out.metrics) == set(Perplexity.metrics) - {"values_skipped", "sparse_v_output_error"}


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


def test_plain_and_method_caches_run_in_lockstep(monkeypatch):
    """Every prefill and decode step feeds the plain cache and then the method's, so their
    speed ratio compares work done moments apart; one timing sample per 16 decode steps."""
    from kvbench.models.session import TorchSession

    fed, real = [], TorchSession.step

    def recording(self, ids, cache, last_only=False):
        fed.append((type(cache).__name__, len(ids)))
        return real(self, ids, cache, last_only)

    monkeypatch.setattr(TorchSession, "step", recording)
    out = _run(Ternary(), continuation=40, decode_chunk=2)
    expected_steps = [2] * 19 + [1]  # 39 tokens fed after the prompt, two at a time
    assert fed == [("DynamicCache", 48), ("KVBenchCache", 48)] + [
        (name, n) for n in expected_steps for name in ("DynamicCache", "KVBenchCache")]
    # 20 decode steps: segments of 16 and 4 steps
    assert len(out.metrics["decode_tok_s"].samples) == 2
    assert len(out.metrics["decode_tok_s_vs_plain"].samples) == 2
    assert all(r > 0 for r in out.metrics["decode_tok_s_vs_plain"].samples)


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


def test_hf_text_is_offline_only():
    with pytest.raises(ValueError, match="datasets|local cache"):
        load_text("hf:kvbench-test/no-such-dataset:train:text")


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
