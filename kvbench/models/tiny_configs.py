"""The configurations of the tiny random-weight models (kvbench.models.tiny), torch-free, so that
validation reads their layers as it reads a checkpoint's config.json (kvbench.models.layer_kinds).

`tiny:llama` and `tiny:qwen3` are the plain decoders the tests have always used. The others are
one per architecture family users bring, each built from transformers' own config class with the
family's defining feature: sliding-window layers (mistral, gemma3), logit softcapping (gemma2),
attention sinks with sliding layers (gpt_oss), MLA (deepseek_v3), experts (qwen3_moe), and
hybrid linear-attention / Mamba layers (qwen3_5, qwen3_next, falcon_h1, jamba).
"""
from __future__ import annotations

from typing import Any

TINY_MAX_CONTEXT = 4096
TINY_HEAD_DIM = 16
WINDOW = 32  # the sliding window of the families that have one

_PLAIN = dict(
    vocab_size=260,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=TINY_HEAD_DIM,
    max_position_embeddings=TINY_MAX_CONTEXT,
    # Wider than the usual 0.02 so attention is peaked enough for cache errors to show in logits.
    initializer_range=0.2,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# The families: hidden 128, 4 query / 2 KV heads of 32, 2 layers.
_FAMILY = dict(_PLAIN, hidden_size=128, intermediate_size=256, head_dim=32)
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
               linear_value_head_dim=32, linear_conv_kernel_dim=4)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
_SLIDING_THEN_FULL = ["sliding_attention", "full_attention"]

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(_PLAIN, model_type="llama"),
    "qwen3": dict(_PLAIN, model_type="qwen3"),
    "mistral": dict(_FAMILY, model_type="mistral", sliding_window=WINDOW),
    "gemma2": dict(_FAMILY, model_type="gemma2", sliding_window=WINDOW,
                   layer_types=_SLIDING_THEN_FULL, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, query_pre_attn_scalar=32),
    "gemma3": dict(_FAMILY, model_type="gemma3_text", sliding_window=WINDOW,
                   layer_types=_SLIDING_THEN_FULL),
    "gpt_oss": dict(_FAMILY, model_type="gpt_oss", sliding_window=WINDOW,
                    layer_types=_SLIDING_THEN_FULL, num_local_experts=4, num_experts_per_tok=2),
    # head_dim is the RoPE part of each head (qk_rope_head_dim), as DeepSeek's config has it
    "deepseek_v3": dict(_FAMILY, model_type="deepseek_v3", num_key_value_heads=4, head_dim=8,
                        kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                        num_experts_per_tok=2, n_group=1, topk_group=1,
                        first_k_dense_replace=1, moe_intermediate_size=64),
    "qwen3_moe": dict(_FAMILY, model_type="qwen3_moe", **_EXPERTS),
    "qwen3_5": dict(_FAMILY, model_type="qwen3_5_text",
                    layer_types=["linear_attention", "full_attention"], **_LINEAR),
    "qwen3_next": dict(_FAMILY, model_type="qwen3_next",
                       layer_types=["linear_attention", "full_attention"], **_LINEAR,
                       **_EXPERTS),
    "falcon_h1": dict(_FAMILY, model_type="falcon_h1", mamba_d_ssm=128, mamba_n_heads=4,
                      mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_expand=1),
    "jamba": dict(_FAMILY, model_type="jamba", attn_layer_period=2, attn_layer_offset=1,
                  expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                  mamba_d_state=8, mamba_dt_rank=8, mamba_expand=1),
}
TINY_KINDS = tuple(TINY_CONFIGS)
