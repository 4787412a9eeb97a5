"""`butterfly`: Compressed Butterfly sparse attention, a sliding window plus block-mean summaries
of the sink block and one deterministic partner block per layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvbench.config.fields import at_least, param
from kvbench.methods.settings.base import MethodSettings, register_method

PartnerRule = Literal["causal_shift", "xor", "fixed_stride", "random", "local_only"]


@register_method("butterfly")
@dataclass
class Butterfly(MethodSettings):
    """Compressed Butterfly: exact attention over a sliding window plus block-mean summaries of
    the sink block and one partner block, merged in one softmax.

    Source: "Compressed Butterfly" (seeds/003; its bna/topology/butterfly.py,
    bna/mlx/attention.py, bna/mlx/compressed_cache.py), restated in docs/methods.md. Upstream's
    behaviour kept here: blocks of `block_size` tokens; a summary is the mean of the block's
    post-RoPE keys and the mean of its values, in float32; a query at position q in block
    b = q // B attends exactly to the last `window` tokens [q - W + 1, q] and to the summaries of
    the sink block 0 and of the partner block, each only when the whole block ends at or before
    q - W + 1; both streams share one softmax. Partner rule `causal_shift`: b - 2^stage, stage =
    layer_idx mod ceil(log2 N). Ablation rules (upstream's same-KV-budget ablation): `local_only`
    (window only, no summaries attended, not even the sink; summaries are still kept and
    counted, so every rule has the same budget), `fixed_stride` (b - 1), `random` (an earlier
    block, seeded), `xor` (b XOR 2^stage when earlier than b).

    Choices where the source is not explicit: N is the number of blocks touched so far by the
    query (q // B + 1), so a query's partner never depends on how long the sequence will get
    (upstream sizes N from the prefill); stages = max(1, ceil(log2 N)). A partner below 0 or not
    yet visible is dropped (no fallback); a partner equal to 0 is the sink, once. The cache holds
    a raw tail of W tokens plus one float32 summary per completed block and float32 sums of the
    open block: retained bytes grow as O(T / B).

    Tensors are (batch=1, kv_heads, tokens, head_dim), post-RoPE, any float dtype.

    Defaults: seeds/003's published run (--block-size 128 --compressed-local-window-tokens 64
    --block-partner-rule causal_shift); upstream Hmbown/Butterfly bna/mlx/compressed_cache.py
    CompressedKVCache and scripts/bench_qwen_consumer_mlx.py default to window 128 (rule xor), and
    cast each float32 block mean back to the cache dtype (kept float32 here).
    """

    adds_keys: ClassVar[bool] = True  # the block summaries
    # reports/ruler (CPU, one thread): 1.35x identity's time on the same 11 cases
    relative_cost: ClassVar[float] = 1.35

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.torch.butterfly",
        "mlx": "kvbench.methods.mlx.token_policies",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"block_size": 8, "window": 8}, {"block_size": 8, "window": 12, "partner_rule": "random"})

    block_size: int = param(128, range=at_least(1), meaning="tokens per block")
    window: int = param(64, range=at_least(1), meaning="the exact-attention window, in tokens")
    partner_rule: PartnerRule = param("causal_shift", meaning="causal_shift, or an ablation"
                                      " rule: local_only, fixed_stride, random, xor")
    seed: int = param(0, meaning="seed of the `random` rule")

    def layout(self) -> str:
        blocks = f"one float32 K/V mean per {self.block_size}-token block"
        if self.partner_rule == "local_only":
            attended = "kept and counted, none attended (local_only)"
        else:
            attended = f"sink + partner by {self.partner_rule}"
        return (f"raw window of {self.window} tokens + {blocks} ({attended});"
                " K and V both counted")
