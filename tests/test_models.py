"""Model specs, tiny models, the transformers cache adapter, K/V capture and the bundled model."""
import dataclasses
import json
import warnings
from dataclasses import dataclass

import pytest
import torch
from transformers import DynamicCache

from kvbench.backends.torch_arrays import tensor_bytes
from kvbench.methods import implementation
from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.settings import MethodSettings, implements
from kvbench.methods.settings.identity import Identity
from kvbench.models import BUNDLED, describe_model, kvbench_home, load_model, prepare_bundled
from kvbench.models.capture import capture_qkv
from kvbench.models.hf_cache import KVBenchCache
from kvbench.models.tiny import ByteTokenizer, build_tiny

TINY = ["tiny:llama", "tiny:qwen3"]
PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


class TestPolicy(LayerCachePolicy):
    """Keeps all tokens (or the newest `keep`); options make it misbehave the ways a bug would."""

    __test__ = False

    def __init__(
        self, keep=None, zero_values=False, bias=False, retained_shift=0, keep_after_prefill=None
    ):
        self.keep, self.zero_values, self.bias = keep, zero_values, bias
        self.keep_after_prefill = keep_after_prefill  # evict once, as compaction methods do
        self.retained_shift = retained_shift  # lie about what is kept
        self.k = self.v = None
        self.seen = 0
        self.appended_keys = []  # every append, so a test can see the positions RoPE gave them
        self.prefill_ended = False

    def append(self, keys, values, queries=None):
        self.appended_keys.append(keys)
        self.seen += keys.shape[-2]
        self.k = keys if self.k is None else torch.cat([self.k, keys], dim=-2)
        self.v = values if self.v is None else torch.cat([self.v, values], dim=-2)
        if self.keep is not None:
            self.k, self.v = self.k[..., -self.keep :, :], self.v[..., -self.keep :, :]

    def attention_inputs(self):
        values = torch.zeros_like(self.v) if self.zero_values else self.v
        bias = torch.zeros(self.k.shape[-2]) if self.bias else None
        return self.k, values, bias

    def end_prefill(self):
        self.prefill_ended = True
        if self.keep_after_prefill is not None:
            n = self.keep_after_prefill
            self.k, self.v = self.k[..., -n:, :], self.v[..., -n:, :]

    @property
    def seen_tokens(self):
        return self.seen

    @property
    def retained_tokens(self):
        return self.k.shape[-2] + self.retained_shift

    @property
    def retained_bytes(self):
        return tensor_bytes(self.k, self.v)

    def measured_bytes(self):
        return tensor_bytes(self.k, self.v)


@dataclass
class TestMethod(MethodSettings):
    """TestPolicy's options as settings."""

    __test__ = False

    keep: int | None = None
    zero_values: bool = False
    bias: bool = False
    retained_shift: int = 0
    keep_after_prefill: int | None = None
    # attention must read what the policy returns, the step's own tokens included
    prefill_reads: str = dataclasses.field(default="stored", kw_only=True)


@implements(TestMethod)
class TorchTestMethod(Implementation):
    def new_layer_cache(self, layer_idx):
        options = self.settings.params()
        del options["prefill_reads"]
        return TestPolicy(**options)


def _cache(settings, num_layers=2):
    """A KVBenchCache of the settings' torch implementation."""
    return KVBenchCache(implementation(settings), num_layers)


def _forward(model, cache, ids):
    """`model` on `ids` through `cache`: a KVBenchCache's forward hands kvbench's attention the
    cache; any other cache is passed as transformers' past_key_values."""
    if isinstance(cache, KVBenchCache):
        return cache.forward(model, ids)
    return model(ids, past_key_values=cache, use_cache=True)


def _ids(text=PROMPT):
    return torch.tensor([ByteTokenizer().encode(text)])


@torch.inference_mode()
def _greedy(model, cache, ids, steps):
    logits = _forward(model, cache, ids).logits[:, -1]
    out = []
    for _ in range(steps):
        token = logits.argmax(-1, keepdim=True)
        out.append(token.item())
        logits = _forward(model, cache, token).logits[:, -1]
    return out


# --- home and specs --------------------------------------------------------------------------


def test_home_prefers_kvbench_home_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_HOME", str(tmp_path / "kv"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kvbench_home() == tmp_path / "kv"
    monkeypatch.delenv("KVBENCH_HOME")
    assert kvbench_home() == tmp_path / "xdg" / "kvbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kvbench_home().parts[-2:] == (".cache", "kvbench")


def test_describe_known_specs():
    assert describe_model("bundled:smollm2-135m").max_context == 8192
    assert BUNDLED["smollm2-135m"].max_context == 8192
    assert describe_model("tiny:qwen3").max_context == 4096


def test_describe_unknown_bundled_name_suggests():
    with pytest.raises(ValueError, match=r"Did you mean 'smollm2-135m'.*Known: smollm2-135m"):
        describe_model("bundled:smollm2-135")


def test_describe_unknown_tiny_kind_suggests():
    with pytest.raises(ValueError, match="Did you mean 'llama'"):
        describe_model("tiny:lama")


def test_describe_local_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert describe_model(str(tmp_path)).max_context == 2048


def test_describe_missing_path_and_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        describe_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=f"{tmp_path}.*no config.json"):
        describe_model(str(tmp_path))


def test_describe_an_uncached_hub_id_offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # so "org/name" is not a local folder either
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="not in the local Hugging Face cache .*"
                                         "kvbench models download kvbench-test/not-cached"):
        describe_model("kvbench-test/not-cached")


# --- tiny models ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_tiny_models_are_the_same_every_time(kind):
    first, second = build_tiny(kind)[0], build_tiny(kind)[0]
    assert first is not second  # one caller's model is never another's
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name


def test_loading_a_tiny_model_on_another_device_leaves_the_first_where_it_was():
    on_cpu = load_model("tiny:llama", "cpu")
    load_model("tiny:llama", "meta")
    assert {p.device.type for p in on_cpu.model.parameters()} == {"cpu"}


def test_tiny_build_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    build_tiny("llama")
    assert torch.equal(torch.rand(3), expected)


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert len(ids) == 6 and min(ids) >= 4 and max(ids) < 260
    assert tok.decode(ids) == "héllo"


def test_load_tiny_geometry():
    loaded = load_model("tiny:qwen3", "cpu")
    assert (loaded.num_layers, loaded.num_kv_heads, loaded.head_dim) == (2, 2, 16)
    assert loaded.max_context == 4096 and loaded.dtype == torch.float32
    assert not loaded.model.training


# --- the cache adapter ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", TINY)
def test_identity_cache_greedy_decode_matches_dynamic_cache(spec):
    loaded = load_model(spec, "cpu")
    plain = _greedy(loaded.model, DynamicCache(config=loaded.model.config), _ids(), 12)
    ours = _greedy(loaded.model, _cache(Identity(), loaded.num_layers), _ids(), 12)
    assert ours == plain


@pytest.mark.parametrize("spec", TINY)
@torch.inference_mode()
def test_attention_reads_the_policy(spec):
    loaded = load_model(spec, "cpu")
    plain = loaded.model(_ids()).logits
    same = _cache(TestMethod()).forward(loaded.model, _ids()).logits
    zero_values = _cache(TestMethod(zero_values=True))
    zeroed = zero_values.forward(loaded.model, _ids()).logits
    torch.testing.assert_close(same, plain, rtol=1e-5, atol=1e-5)
    assert (zeroed - plain).abs().max() > 1e-2


@torch.inference_mode()
def test_exact_reads_give_a_step_its_own_keys_and_values(tiny_llama):
    """prefill_reads exact: a policy that stores zeros for values leaves the prompt's forward the
    plain model's, bit for bit; the next step reads the prompt as stored (zeros)."""
    model, ids = tiny_llama.model, _ids()
    plain_cache = DynamicCache(config=model.config)
    plain = model(ids, past_key_values=plain_cache).logits
    exact = _cache(TestMethod(zero_values=True, prefill_reads="exact"), num_layers=len(plain_cache))
    stored = _cache(TestMethod(zero_values=True), num_layers=len(plain_cache))
    assert torch.equal(exact.forward(model, ids).logits, plain)
    assert (stored.forward(model, ids).logits - plain).abs().max() > 1e-2
    token = ids[:, -1:]
    after_plain = model(token, past_key_values=plain_cache).logits
    assert (exact.forward(model, token).logits - after_plain).abs().max() > 1e-2


@torch.inference_mode()
def test_positions_continue_from_seen_tokens_when_a_policy_keeps_fewer(tiny_llama):
    model = tiny_llama.model
    ids = _ids()
    n = ids.shape[1]
    full = DynamicCache(config=model.config)
    model(ids, past_key_values=full)

    cache = _cache(TestMethod(keep=8))
    cache.layers[0].policy.keep = None  # layer 0 keeps all prefill tokens so the mask fits
    cache.layers[1].policy.keep = None
    cache.forward(model, ids[:, : n - 3])
    assert cache.get_seq_length() == n - 3
    for policy in cache.policies:
        policy.keep = 8  # from now on every layer keeps only the newest 8
    for step in range(n - 3, n):
        cache.forward(model, ids[:, step : step + 1])
        assert cache.get_seq_length() == step + 1
    assert cache.retained_tokens() == [8, 8]
    assert cache.get_mask_sizes(1, 0) == (9, n - 8)
    # The last key was rotated for its true position n-1, not for its index among 8 kept keys.
    last = cache.policies[0].appended_keys[-1]
    torch.testing.assert_close(last, full.layers[0].keys[..., -1:, :], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", TINY)
@torch.inference_mode()
def test_chunked_decode_after_eviction_matches_token_by_token(spec):
    # A chunk needs a causal mask over kept + new keys, offset to the true positions; one token
    # at a time needs none. Both must give the same logits.
    model = load_model(spec, "cpu").model
    ids = _ids()

    def decode(chunk):
        cache = _cache(TestMethod(keep_after_prefill=16))
        cache.forward(model, ids[:, :40])
        cache.end_prefill()
        steps = [ids[:, i : i + chunk] for i in range(40, 48, chunk)]
        logits = torch.cat([cache.forward(model, step).logits for step in steps], dim=1)
        assert cache.retained_tokens() == [24, 24] and cache.get_seq_length() == 48
        return logits

    torch.testing.assert_close(decode(8), decode(1), rtol=1e-5, atol=1e-5)


def test_seq_length_and_accounting_through_prefill_and_decode(tiny_llama):
    cache = _cache(Identity(), tiny_llama.num_layers)
    assert cache.get_seq_length() == 0
    _greedy(tiny_llama.model, cache, _ids(), 5)
    tokens = _ids().shape[1] + 5
    assert cache.get_seq_length() == tokens
    assert cache.retained_tokens() == [tokens, tokens]
    vectors = tiny_llama.num_layers * 2 * tiny_llama.num_kv_heads  # K and V per layer and head
    per_token = vectors * tiny_llama.head_dim * 4  # fp32
    assert cache.accounted_bytes() == tokens * per_token
    assert cache.measured_bytes() >= cache.accounted_bytes()


def test_end_prefill_reaches_every_layer():
    cache = _cache(TestMethod())
    cache.end_prefill()
    assert all(policy.prefill_ended for policy in cache.policies)


@torch.inference_mode()
def test_a_bias_of_the_wrong_shape_is_refused(tiny_llama):
    model = tiny_llama.model
    with pytest.raises(RuntimeError, match=r"key bias of shape \(\d+,\); it must be"):
        _cache(TestMethod(bias=True)).forward(model, _ids())


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(retained_shift=1), r"layer 0: TestPolicy retains \d+ tokens after seeing"),
        (dict(keep=1, retained_shift=-1), r"layer 0: TestPolicy retains 0 tokens"),
    ],
)
@torch.inference_mode()
def test_a_policy_keeping_nothing_or_more_than_it_saw_is_a_bug(options, message, tiny_llama):
    model = tiny_llama.model
    with pytest.raises(RuntimeError, match=message):
        _cache(TestMethod(**options)).forward(model, _ids())


@torch.inference_mode()
def test_dropping_tokens_inside_a_multi_token_step_is_refused(tiny_llama):
    model = tiny_llama.model
    with pytest.raises(RuntimeError, match="layer 0: 4 keys for a 90-token step.*sized for 90"):
        _cache(TestMethod(keep=4)).forward(model, _ids())


# --- capture ----------------------------------------------------------------------------------


@torch.inference_mode()
def test_capture_returns_what_attention_caches():
    loaded = load_model("tiny:qwen3", "cpu")
    ids = ByteTokenizer().encode(PROMPT)
    captured = capture_qkv(loaded, ids, [0, 1])
    cache = _cache(TestMethod())
    cache.forward(loaded.model, torch.tensor([ids]))
    for layer in (0, 1):
        got = captured[layer]
        assert got.keys.shape == got.values.shape == (1, 2, len(ids), 16)
        assert got.queries.shape == (1, 4, len(ids), 16) and got.keys.dtype == torch.float32
        torch.testing.assert_close(got.keys, cache.policies[layer].k)
        torch.testing.assert_close(got.values, cache.policies[layer].v)
    with pytest.raises(ValueError, match=r"layers \[2\] out of range"):
        capture_qkv(loaded, ids, [2])


@pytest.mark.parametrize("kind", ["tiny:llama", "tiny:qwen3"])
@torch.inference_mode()
def test_captured_queries_reproduce_the_attention_output(kind):
    """Causal softmax(Q K^T / sqrt(d)) V from the captured tensors is what the layer fed o_proj."""
    loaded = load_model(kind, "cpu")
    ids = ByteTokenizer().encode(PROMPT)
    fed = {}
    o_proj = loaded.model.model.layers[1].self_attn.o_proj
    hook = o_proj.register_forward_pre_hook(lambda module, args: fed.update(x=args[0]))
    try:
        got = capture_qkv(loaded, ids, [1])[1]
    finally:
        hook.remove()
    group = got.queries.shape[1] // got.keys.shape[1]
    keys = got.keys.repeat_interleave(group, dim=1)
    values = got.values.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(got.queries, keys, values, is_causal=True)
    torch.testing.assert_close(out.transpose(1, 2).flatten(2), fed["x"], rtol=1e-4, atol=1e-5)


# --- the bundled model ------------------------------------------------------------------------


def test_prepare_unknown_bundled_name():
    with pytest.raises(ValueError, match="Did you mean 'smollm2-135m'"):
        prepare_bundled("smollm2")


@pytest.mark.model
def test_bundled_checkpoint_is_verified_and_mlx_readable(bundled):
    folder = kvbench_home() / "models" / "smollm2-135m"
    marker = json.loads((folder / "kvbench.json").read_text())
    assert marker["verified"] is True and len(marker["source"]["sha256"]) == 64
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_theta"] == 100000.0  # mlx-lm reads only this top-level key
    assert config.get("rope_parameters", {}).get("rope_theta", 100000.0) == config["rope_theta"]
    assert (bundled.num_layers, bundled.num_kv_heads, bundled.head_dim) == (30, 3, 64)
    assert bundled.max_context == 8192

    lines = []
    assert prepare_bundled("smollm2-135m", log=lines.append) == folder
    assert lines == []  # prepared already: nothing to do


@pytest.mark.model
def test_bundled_greedy_decode_matches_dynamic_cache(bundled):
    ids = torch.tensor([bundled.tokenizer.encode("def fibonacci(n):\n    ")])
    plain = _greedy(bundled.model, DynamicCache(config=bundled.model.config), ids, 8)
    ours = _greedy(bundled.model, _cache(Identity(), bundled.num_layers), ids, 8)
    assert ours == plain


@pytest.mark.slow
def test_prepare_into_a_fresh_home(monkeypatch, tmp_path):
    monkeypatch.setenv("KVBENCH_HOME", str(tmp_path))
    lines = []
    folder = prepare_bundled("smollm2-135m", log=lines.append)
    assert folder == tmp_path / "models" / "smollm2-135m"
    assert any("verified" in line for line in lines)
    assert json.loads((folder / "kvbench.json").read_text())["max_abs_logit_diff"] <= 1e-4
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left


@pytest.mark.parametrize("kind", TINY)
def test_the_cache_goes_by_the_keyword_the_model_takes_without_a_deprecation(kind):
    """transformers 5 renamed forward's past_key_values to cache and warns at every call made
    the old way: every path kvbench runs a model by (plain cache, kvbench's cache, the batched
    step, K/V capture) passes it the current way."""
    from kvbench.models.session import TorchSession

    loaded = load_model(kind, "cpu")
    session = TorchSession(loaded, torch.device("cpu"))
    identity = implementation(Identity())
    ids = list(range(5, 17))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        plain = session.step(ids, session.new_cache(None))[0]
        cache = session.new_cache(identity)
        mine = session.step(ids, cache)[0]
        session.step_rows([3], [cache])
        capture_qkv(loaded, ids, layers=[0])
    assert torch.allclose(plain, mine, atol=1e-5)
