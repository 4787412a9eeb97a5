"""The quantizer plug-in path: kvbench's codec caches keep the first `sinks` tokens exact (intq,
lloydmax, turbo, and any plug-in built on CodecMethod), counted at full precision; left unset,
nothing changes and results stay comparable with the committed baseline; and the example
quantizer plug-in (tests/data/example_quant_plugin) installs, is found through its entry point,
passes the conformance kit, and is shown as it is in docs/writing-a-method.md."""
from __future__ import annotations

import pytest
import torch

from kvbench.methods import build_method, implementation
from kvbench.methods.core.codec_cache import append_rows
from tests.plugins.examples import install_and_test
from tests.plugins.suites import ROOT
from tests.plugins.tensors import ATTENTION_TOLERANCE, exact_attention, randn

CODECS = [("intq", {"bits": 4}), ("lloydmax", {"bits": 3}), ("turbo", {"bits": 3, "block": 64})]


def _method(name: str, **params):
    return implementation(build_method(name, params))


def _kv(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return randn(1, 2, tokens, 64, seed=seed), randn(1, 2, tokens, 64, seed=seed + 1)


@pytest.mark.parametrize("name,params", CODECS, ids=[name for name, _ in CODECS])
def test_sinks_and_window_read_back_bit_equal_and_the_middle_quantized(name, params):
    cache = _method(name, **params, sinks=4, window=8).new_layer_cache(0)
    keys, values = _kv(40, seed=0)
    cache.append(keys[..., :30, :], values[..., :30, :])  # a prompt, then one-token steps
    for t in range(30, 40):
        cache.append(keys[..., t : t + 1, :], values[..., t : t + 1, :])
    read_keys, read_values, bias = cache.attention_inputs()
    assert bias is None and cache.retained_tokens == cache.seen_tokens == 40
    for read, given in ((read_keys, keys), (read_values, values)):
        exact = (read == given).all(-1)[0]  # (heads, tokens): the token read back bit-equal
        assert exact[:, :4].all() and exact[:, -8:].all() and not exact[:, 4:-8].any()


def test_sink_rows_are_counted_at_full_precision():
    method = _method("intq", bits=4, sinks=4, window=8)
    codec, cache = method.codec(), method.new_layer_cache(0)
    keys, values = _kv(40, seed=2)
    cache.append(keys, values)
    packed = sum(codec.nbytes(codec.encode(x[..., 4:32, :])) for x in (keys, values))
    exact = 2 * keys[..., :4, :].nbytes + 2 * keys[..., 32:, :].nbytes  # K and V, float32
    assert cache.retained_bytes == packed + exact
    assert cache.measured_bytes() >= cache.retained_bytes


def test_without_sinks_the_cache_packs_from_the_first_token():
    method = _method("intq", bits=4, window=8)
    codec, cache = method.codec(), method.new_layer_cache(0)
    keys, values = _kv(40, seed=4)
    cache.append(keys, values)
    expected = torch.cat([codec.decode(codec.encode(keys[..., :32, :])), keys[..., 32:, :]], -2)
    assert torch.equal(cache.attention_inputs()[0], expected)
    assert method.settings.sinks is None and "first" not in method.layout()


def test_unset_sinks_keep_the_committed_baseline_comparable():
    from kvbench.judge.gate import fingerprint_differences
    from kvbench.results import load_results
    from kvbench.suite import load_suite

    baseline = load_results(ROOT / "baselines" / "quick.linux-x86_64-cpu.json")
    now = {case.id: case for case in load_suite(ROOT / "suites" / "quick.yaml").cases}
    intq = [case for case in baseline.cases if case.method == "intq"]
    assert intq and all("sinks" in now[case.id].method_params for case in intq)
    for old in baseline.cases:
        new = old.model_copy(update={"method_params": now[old.id].method_params})
        assert fingerprint_differences(old, new) == [], old.id


def test_sinks_are_taken_back_only_while_nothing_is_packed():
    cache = _method("intq", bits=4, sinks=4, window=0).new_layer_cache(0)
    keys, values = _kv(12, seed=6)
    cache.append(keys[..., :3, :], values[..., :3, :])  # all in the sinks
    assert cache.holds_exactly(3) and cache.trim(2) == 2 and cache.retained_tokens == 1
    cache.append(keys[..., 1:12, :], values[..., 1:12, :])  # the sinks fill again, in order
    read_keys = cache.attention_inputs()[0]
    assert torch.equal(read_keys[..., :4, :], keys[..., :4, :])
    assert not cache.holds_exactly(1) and cache.trim(5) == 0 and cache.retained_tokens == 12


def test_a_batched_append_stores_each_row_as_alone():
    method = _method("intq", bits=4, sinks=4, window=8)
    alone = [method.new_layer_cache(0) for _ in range(2)]
    batched = [method.new_layer_cache(0) for _ in range(2)]
    for step, tokens in enumerate((3, 5, 1, 20, 1)):
        keys, values = randn(2, 2, tokens, 64, seed=step), randn(2, 2, tokens, 64, seed=9 + step)
        for row, cache in enumerate(alone):
            cache.append(keys[row : row + 1], values[row : row + 1])
        append_rows(batched, keys, values)
    for one, many in zip(alone, batched):
        assert one.retained_bytes == many.retained_bytes
        assert all(torch.equal(a, b) for a, b in zip(one.attention_inputs()[:2],
                                                     many.attention_inputs()[:2]))


def test_the_batched_lane_is_not_taken_with_sinks():
    # the lane (kvbench.models.batch_lane) reads the packed rooms alone
    rooms = {}
    for sinks in (None, 4):
        cache = _method("intq", bits=4, sinks=sinks).new_layer_cache(0)
        cache.reserve(100)
        cache.append(*_kv(40, seed=8))
        rooms[sinks] = cache.step_rooms()
    assert rooms[None] is not None and rooms[4] is None


def test_the_fused_cpu_read_takes_the_sinks_first():
    pytest.importorskip("numba", reason="the CPU fused attention needs numba (kvbench[torch])")
    from kvbench.kernels.cpu import attention

    cache = _method("intq", bits=4, sinks=4, window=8).new_layer_cache(0)
    keys, values = _kv(40, seed=10)
    cache.append(keys, values)
    read = cache.attention_segments()
    assert read is not None and read.kernel == "cpu" and read.tokens == cache.retained_tokens
    first = read.segments[0]
    assert first.key_format is None and torch.equal(first.keys, keys[..., :4, :])
    query = randn(1, 4, 64, seed=12)
    read_keys, read_values, _ = cache.attention_inputs()
    exact = exact_attention(query, read_keys, read_values, None, 64 ** -0.5)
    out = attention.decode_attention(query, read.segments)
    assert float((out.double() - exact).norm() / exact.norm()) < ATTENTION_TOLERANCE[torch.float32]


# ---- the example quantizer plug-in -------------------------------------------------------------

EXAMPLE = ROOT / "tests" / "data" / "example_quant_plugin"


def test_the_example_quantizer_installs_and_passes(tmp_path):
    """Installed as a package, found through the entry point, checked with kvbench.testing and
    its sinks and window read back exact, by its own test file."""
    done = install_and_test("example_quant_plugin", "test_sinkq.py", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_the_method_page_shows_the_example_as_it_is():
    page = (ROOT / "docs" / "writing-a-method.md").read_text()
    for name in ("__init__.py", "torch_codec.py"):
        source = (EXAMPLE / "kvbench_sinkq" / name).read_text()
        assert f"`kvbench_sinkq/{name}`" in page and f"```python\n{source}```\n" in page
    assert f"```toml\n{(EXAMPLE / 'pyproject.toml').read_text()}```\n" in page
