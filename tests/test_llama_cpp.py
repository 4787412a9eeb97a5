"""llama.cpp (llama-cpp-python's server) as a target of kvbench's benchmarks, on the bundled model's
GGUF: perplexity scored through `python -m kvbench.serve.llama_cpp` beside kvbench's own on the
same window, and stress's users against the same server. The default run starts one server (f16
K and V cache); the quantized caches and llama-cpp-python's own server are in the slow run."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")
require_extra("llama-cpp")

from kvbench.benchmarks import measurement
from kvbench.benchmarks.measure.servers import ServerError
from kvbench.benchmarks.specs.perplexity import Perplexity, PerplexityParams
from kvbench.benchmarks.specs.stress import Stress, StressParams
from kvbench.methods import implementation
from kvbench.methods.settings.identity import Identity
from tests.plugins.model_runs import cpu_context

pytestmark = pytest.mark.model  # the bundled model: its GGUF, and kvbench's checkpoint of it

URL = "http://127.0.0.1:{port}"
# llama.cpp's f16 cache against kvbench's float32 model on one window: measured -0.14% (128 +
# 32 tokens, 12.104 against 12.121) and +0.39% (1024 + 128 tokens, 11.437 against 11.393); see
# test_f16_perplexity_is_kvbench_identity for what the gap is made of.
F16_TOLERANCE = 0.01


def llama_server(cache: str, module: str = "kvbench.serve.llama_cpp",
                 flash_attn: str = "true") -> list[str]:
    """The command of a llama-cpp-python server on the bundled GGUF, K and V cached as `cache`
    (a ggml type: f16, q8_0, q4_0), on two threads."""
    import llama_cpp

    ggml = str(getattr(llama_cpp, f"GGML_TYPE_{cache.upper()}"))
    return ["{python}", "-m", module, "--model", "{gguf:smollm2-135m}",
            "--host", "127.0.0.1", "--port", "{port}", "--n_ctx", "512",
            "--n_threads", "2", "--n_threads_batch", "2", "--type_k", ggml, "--type_v", ggml,
            "--flash_attn", flash_attn, "--interrupt_requests", "false", "--verbose", "false"]


@pytest.fixture(scope="module")
def ctx(bundled, tmp_path_factory):
    """One run's context for the module: its pool keeps each server for the next test."""
    ctx = cpu_context(loaded=bundled)
    ctx.files_dir = tmp_path_factory.mktemp("files")
    yield ctx
    ctx.memo.close()


def perplexity(ctx, command: list[str]):
    params = PerplexityParams(context=128, continuation=32,
                              server={"command": command, "url": URL})
    return measurement(Perplexity).run(params, implementation(Identity()), ctx)


def test_f16_perplexity_is_kvbench_identity(ctx):
    """The same window through llama.cpp's f16 cache and kvbench's plain one (what identity
    equals bit for bit). Not to the bit: llama.cpp multiplies the Q4_1 weights with activations
    rounded to 8 bits (Q8_1) and caches K and V in f16, kvbench the float32 weights dequantized
    from the same file, in float32. Echoed logprobs off by one position (llama-cpp-python's own
    echo) would put it orders of magnitude off."""
    out = perplexity(ctx, llama_server("f16"))
    ppl, reference = out.metrics["perplexity"].value, out.metrics["ppl_reference"].value
    assert abs(ppl / reference - 1) < F16_TOLERANCE, (ppl, reference)
    assert out.info["server_started_for_this_case"] is True
    log = Path(out.info["server_log"])
    assert log.parent == ctx.files_dir and "kvbench.serve.llama_cpp" in log.read_text()
    assert str(Path(out.info["server_command"][4])).endswith(".gguf")  # {gguf:...} filled


def test_stress_users_against_the_same_server(ctx):
    """The same server under two users: llama-cpp-python answers one request at a time, with
    interrupt_requests off (on, a waiting request cuts the streaming one short). Its answers
    may differ from the single-user ones by float noise, never beyond it: it reuses the cache of
    the previous request's common prefix, so a prompt is evaluated in other batches from one
    request to the next."""
    params = StressParams(users=2, requests_per_user=1, prompts=2, prompt_tokens=64,
                          max_tokens=8, server={"command": llama_server("f16"), "url": URL,
                                                "logprobs": True})
    out = measurement(Stress).run(params, implementation(Identity()), ctx)
    m = {name: metric.value for name, metric in out.metrics.items()}
    assert m["errors"] == 0 and m["requests"] == 2, out.info["failures"]
    assert m["output_tokens"] > 0 and m["responses_flagged"] == 0
    assert out.info["server_started_for_this_case"] is False  # perplexity's, kept in the pool
    assert out.info["logprobs"] is True  # the answers' top logprobs came back
    # no usage and no token ids in its stream: the tokens are counted by the model's tokenizer
    assert out.info["token_count_source"] == {"tokenizer": 2}


@pytest.mark.slow
def test_the_cache_type_is_the_one_named(ctx):
    """q8_0 and q4_0 K and V move the perplexity off f16's, by a few percent. Their order is
    not asserted: one window of 32 scored tokens does not settle it (here q4_0 scored below
    q8_0 and f16; over 128 tokens after 1024 it came out f16 11.437, q8_0 11.399, q4_0 11.799)."""
    f16, q8, q4 = (perplexity(ctx, llama_server(cache)).metrics["perplexity"].value
                   for cache in ("f16", "q8_0", "q4_0"))
    for quantized in (q8, q4):
        assert 1e-4 < abs(quantized / f16 - 1) < 0.05, (f16, q8, q4)


@pytest.mark.slow
def test_llama_cpp_pythons_own_server_takes_no_token_ids(ctx):
    with pytest.raises(RuntimeError, match=r"HTTP 500: .*valid string.*kvbench\.serve\.llama_cpp"):
        perplexity(ctx, llama_server("f16", module="llama_cpp.server"))


@pytest.mark.slow
def test_a_quantized_v_cache_needs_flash_attention(ctx):
    with pytest.raises(ServerError, match="exited"):
        perplexity(ctx, llama_server("q4_0", flash_attn="false"))
