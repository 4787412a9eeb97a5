"""What a case takes at once is sized by the device it runs on (kvbench.models.budgets): the
tokens of a prefill forward and the server's, from the model's activations and the free memory."""
from __future__ import annotations

from types import SimpleNamespace

from kvbench.models import budgets
from kvbench.models.tiny_configs import TINY_CONFIGS

GIB = 1 << 30


def test_a_forward_takes_what_fits_an_eighth_of_the_free_memory_in_powers_of_two():
    per_token = 160_000  # an 8B's in bf16 (kvbench.models.budgets.activation_bytes_per_token)
    assert budgets.prefill_chunk(per_token, 1 * GIB) == 512  # 838 tokens fit: at least 512
    assert budgets.prefill_chunk(per_token, 8 * GIB) == 4096  # 6710 fit
    assert budgets.prefill_chunk(per_token, 60 * GIB) == 8192  # 50k fit: at most 8192
    assert budgets.prefill_chunk(per_token, 0) == budgets.MIN_CHUNK


def test_at_a_long_context_a_forward_takes_at_most_an_eighth_of_the_plain_cache():
    """Activations and the attention mask (MASK_BYTES per query and key) of a chunk within
    CACHE_SHARE of the plain cache at the context, or CHUNK_FLOOR_BYTES where that is more."""
    tiny = (1024 + 12288 + 1536) * 4  # tiny:llama-8b-attention's activations at float32
    plain = 2 * 8 * 256 * 4 * 32768  # its 2 layers' K+V at 32k: 512 MiB, an eighth under the floor
    chunk = budgets.prefill_chunk(tiny, 20 * GIB, 32768, plain)
    assert chunk == 256  # 128 MiB / (59 KB + 10 x 32768) = 346 tokens
    assert chunk * (tiny + budgets.MASK_BYTES * 32768) <= budgets.CHUNK_FLOOR_BYTES
    eight_b = 160_000
    plain = 32 * 8 * 256 * 2 * 131072  # Llama-3.1-8B's K+V at 128k in bf16: 16 GiB
    chunk = budgets.prefill_chunk(eight_b, 80 * GIB, 131072, plain)
    assert chunk == 1024  # 2 GiB / (160 KB + 1.3 MB) = 1460 tokens
    assert chunk * (eight_b + budgets.MASK_BYTES * 131072) <= plain // budgets.CACHE_SHARE
    # without a context (a server's streams): the free memory alone, as before
    assert budgets.prefill_chunk(eight_b, 80 * GIB) == 8192


def test_a_short_prompt_stays_one_forward():
    """The quick suite's 1k prompts on the bundled model: the floor keeps them whole."""
    smollm = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                             head_dim=64, intermediate_size=1536)
    per_token = budgets.activation_bytes_per_token(smollm, 4)
    plain = 30 * 3 * 128 * 4 * 1024
    assert budgets.prefill_chunk(per_token, 20 * GIB, 1024, plain) >= 1024


def test_a_server_waits_at_most_512_tokens_on_a_cpu_and_2048_on_a_gpu():
    assert budgets.serve_prefill_chunk(160_000, 60 * GIB, on_cpu=True) == 512
    assert budgets.serve_prefill_chunk(160_000, 60 * GIB, on_cpu=False) == 2048
    assert budgets.serve_prefill_chunk(160_000, 1 * GIB, on_cpu=False) == 512


def test_the_activations_of_a_token_come_from_the_config():
    llama = SimpleNamespace(**TINY_CONFIGS["llama-8b-attention"])
    # 4 x 256 hidden, (32 + 2 x 8) heads x 128 twice, 3 x 512 intermediate, at 4 bytes
    assert budgets.activation_bytes_per_token(llama, 4) == (1024 + 12288 + 1536) * 4
    moe = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=16,
                          intermediate_size=32, moe_intermediate_size=64, num_experts_per_tok=2)
    # no num_key_value_heads: as many as the query heads; the routed experts' 128 are the widest
    assert budgets.activation_bytes_per_token(moe, 2) == (256 + 12 * 16 * 2 + 3 * 128) * 2


def test_a_decode_group_takes_a_quarter_of_the_free_memory():
    assert budgets.decode_budget(80 * GIB) == 20 * GIB
