"""Token-reduction methods (and butterfly) on MLX: the torch reference policy itself, as an mlx-lm
cache layer.

Which tokens to keep, and AM's beta and value fits, are one-off decisions on float32/float64
math, done by the torch reference; the arrays cross over at each call (numpy copies). The model,
its attention and the bias added to its logits run in MLX. On Linux this is for correctness and
parity; an Apple Silicon port that keeps the arrays in MLX would be measured against it.
"""
from __future__ import annotations

from kvbench.methods.base import LayerCachePolicy, WrappedPolicy
from kvbench.methods.am import AM, AMTask
from kvbench.methods.butterfly import Butterfly
from kvbench.methods.eviction import H2O, SnapKV, StreamingLLM
from kvbench.methods.mlx.base import MLXMethod, mlx_implementation, to_mx, to_torch


class TorchPolicyOnMLX(WrappedPolicy):
    """A torch policy taking and giving mx.arrays."""

    def append(self, keys, values, queries=None) -> None:
        self.inner.append(to_torch(keys), to_torch(values))

    def attention_inputs(self):
        keys, values, bias = self.inner.attention_inputs()
        return to_mx(keys), to_mx(values), None if bias is None else to_mx(bias)

    def observe_queries(self, queries) -> None:
        self.inner.observe_queries(to_torch(queries))


@mlx_implementation(StreamingLLM, SnapKV, H2O, AM, AMTask, Butterfly)
class MLXTokenMethod(MLXMethod):
    """streamingllm, snapkv, h2o, am, am_task, butterfly: their torch policies, bridged."""

    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        return TorchPolicyOnMLX(self.config.new_layer_cache(layer_idx))
