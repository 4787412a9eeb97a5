"""The configurations of the tiny random-weight models (kvbench.models.tiny), torch-free, so that
validation reads their layers as it reads a checkpoint's config.json (kvbench.models.layer_kinds).

`tiny:llama` and `tiny:qwen3` are the plain decoders the tests have always used. The others are
one per architecture family users bring, each built from transformers' own config class with the
family's defining feature: sliding-window layers (mistral, gemma3), logit softcapping (gemma2),
attention sinks with sliding layers (gpt_oss), MLA (deepseek_v3), experts (qwen3_moe), and
hybrid linear-attention / Mamba layers (qwen3_5, qwen3_next, falcon_h1, jamba). The second round:
sliding or chunked layers beside full ones (cohere2, exaone4, olmo3, llama4 with NoPE layers),
NoPE layers (smollm3), every layer sliding (ministral3), layers that reuse another layer's K/V
(gemma3n), short-conv, linear-attention and Mamba layers beside attention (lfm2, kimi_linear
with MLA, minimax with its own cache class, granitemoehybrid, nemotron_h), no attention at all
(mamba2), one attention block shared by several depths (zamba2), and an indexer choosing each
query's keys (deepseek_v32).
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
_MLA = dict(num_key_value_heads=4, head_dim=8, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16)
_ROUTED = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               first_k_dense_replace=1, moe_intermediate_size=64)

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
    "deepseek_v3": dict(_FAMILY, model_type="deepseek_v3", q_lora_rank=None, **_MLA, **_ROUTED),
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
    # the second round
    # tied embeddings, as the family's own config (mlx-lm's cohere2 and lfm2 have no lm_head)
    "cohere2": dict(_FAMILY, model_type="cohere2", sliding_window=WINDOW,
                    layer_types=_SLIDING_THEN_FULL, tie_word_embeddings=True),
    "exaone4": dict(_FAMILY, model_type="exaone4", sliding_window=WINDOW,
                    layer_types=_SLIDING_THEN_FULL),
    "olmo3": dict(_FAMILY, model_type="olmo3", sliding_window=WINDOW,
                  layer_types=_SLIDING_THEN_FULL),
    # three chunked layers with RoPE, then a full one without (no_rope_layers: 1 = RoPE)
    "llama4": dict(_FAMILY, model_type="llama4_text", num_hidden_layers=4,
                   attention_chunk_size=WINDOW, no_rope_layers=[1, 1, 1, 0],
                   num_local_experts=2, num_experts_per_tok=1, intermediate_size_mlp=256),
    "smollm3": dict(_FAMILY, model_type="smollm3", no_rope_layers=[1, 0]),
    "glm4_moe": dict(_FAMILY, model_type="glm4_moe", **_ROUTED),
    "lfm2": dict(_FAMILY, model_type="lfm2", layer_types=["conv", "full_attention"],
                 block_dim=128, block_ff_dim=256, tie_word_embeddings=True),
    "kimi_linear": dict(_FAMILY, model_type="kimi_linear", q_lora_rank=None,
                        layer_types=["linear_attention", "full_attention"], linear_head_dim=32,
                        linear_num_heads=4, num_local_experts=4, **_MLA, **_ROUTED),
    # layers 2 and 3 reuse the K/V of the last earlier layer of their type (0 and 1)
    "gemma3n": dict(_FAMILY, model_type="gemma3n_text", num_hidden_layers=4,
                    sliding_window=WINDOW, layer_types=_SLIDING_THEN_FULL * 2,
                    num_kv_shared_layers=2, vocab_size_per_layer_input=260,
                    hidden_size_per_layer_input=16, laurel_rank=8),
    "minimax": dict(_FAMILY, model_type="minimax", layer_types=["linear_attention",
                                                                "full_attention"],
                    num_local_experts=2, num_experts_per_tok=1),
    "granitemoehybrid": dict(_FAMILY, model_type="granitemoehybrid",
                             layer_types=["mamba", "attention"], mamba_n_heads=4,
                             mamba_d_head=32, mamba_d_state=16, mamba_expand=1,
                             num_local_experts=2, num_experts_per_tok=1),
    # Mamba, MoE, attention, MLP
    "nemotron_h": dict(_FAMILY, model_type="nemotron_h", num_hidden_layers=4,
                       hybrid_override_pattern="ME*-", mamba_num_heads=4, mamba_head_dim=32,
                       ssm_state_size=16, expand=1, n_groups=1, n_routed_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=64, moe_shared_expert_intermediate_size=64),
    "mamba2": dict(_FAMILY, model_type="mamba2", num_heads=8, head_dim=32, expand=2,
                   state_size=16, n_groups=1, chunk_size=32),
    # one attention block, shared by layers 1 and 3, each with its own cache
    "zamba2": dict(_FAMILY, model_type="zamba2", num_hidden_layers=4,
                   layers_block_type=["mamba", "hybrid"] * 2, mamba_d_state=16,
                   n_mamba_heads=4, mamba_expand=1, chunk_size=32, use_mem_rope=True),
    # 8 index heads: with 2, the indexer's relu scores tie at 0 and top-k breaks the ties by the
    # number of keys, so the model's own full forward and decode differ (0.44 relative)
    "deepseek_v32": dict(_FAMILY, model_type="deepseek_v32", q_lora_rank=32, **_MLA, **_ROUTED,
                         index_topk=16, index_head_dim=16, index_n_heads=8),
    "ministral3": dict(_FAMILY, model_type="ministral3", sliding_window=WINDOW,
                       # its default YaRN, stretched from 1k to the 4k context (and Llama 4's
                       # query scaling by position), consistent with max_position_embeddings
                       rope_parameters=dict(type="yarn", rope_theta=1e6, factor=4.0,
                                            original_max_position_embeddings=1024,
                                            beta_fast=32.0, beta_slow=1.0, mscale_all_dim=1.0,
                                            mscale=1.0, llama_4_scaling_beta=0.1)),
}
TINY_KINDS = tuple(TINY_CONFIGS)  # the architecture families
# Shapes, not families: a long context's footprint measured at a real model's attention shape
# (Llama-3.1-8B's 32 query heads, 8 KV heads of 128: queries 4x the keys) in a small model
TINY_CONFIGS["llama-8b-attention"] = dict(
    _PLAIN, model_type="llama", hidden_size=256, intermediate_size=512, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=65536, rope_theta=500000.0)
