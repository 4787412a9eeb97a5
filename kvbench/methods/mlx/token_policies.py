"""Token-reduction methods (and butterfly) on MLX: the torch reference policy itself, as an mlx-lm
cache layer.

Which tokens to keep, and AM's beta and value fits, are one-off decisions on float32/float64
math, done by the torch reference (its scores and fits over blocks of queries, as on the CPU:
token_cache.score_block_bytes); the arrays cross over at each call (numpy copies). The model,
its attention and the bias added to its logits run in MLX. On Linux this is for correctness and
parity; an Apple Silicon port that keeps the arrays in MLX would be measured against it.
"""
from __future__ import annotations

from kvbench.backends.mlx_arrays import to_mx, to_torch
from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.core.wrapped_policy import WrappedPolicy
from kvbench.methods.settings.am import AM, AMTask
from kvbench.methods.settings.base import implements, registered_implementation
from kvbench.methods.settings.butterfly import Butterfly
from kvbench.methods.settings.eviction import H2O, SnapKV, StreamingLLM


class TorchPolicyOnMLX(WrappedPolicy):
    """A torch policy taking and giving mx.arrays."""

    def append(self, keys, values, queries=None) -> None:
        self.inner.append(to_torch(keys), to_torch(values))

    def take_prompt(self, keys, values, key_buffer, value_buffer) -> bool:
        return False  # they cross over as copies: nothing to take over

    def attention_inputs(self):
        keys, values, bias = self.inner.attention_inputs()
        return to_mx(keys), to_mx(values), None if bias is None else to_mx(bias)

    def observe_queries(self, queries) -> None:
        self.inner.observe_queries(to_torch(queries))


@implements(StreamingLLM, SnapKV, H2O, AM, AMTask, Butterfly, backend="mlx")
class MLXTokenMethod(Implementation):
    """streamingllm, snapkv, h2o, am, am_task, butterfly: their torch policies, bridged."""

    def __init__(self, settings, on):
        super().__init__(settings, on)
        self.reference = registered_implementation(type(settings), "torch")(settings, None)

    @property
    def shares_prefill(self) -> bool:
        # the bridge hands the policy the model's keys and values exactly (lossless copies)
        return self.reference.shares_prefill

    @property
    def prompt_queries(self) -> int | None:
        return self.reference.prompt_queries

    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        return TorchPolicyOnMLX(self.reference.new_layer_cache(layer_idx))
