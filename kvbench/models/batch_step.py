"""One decode step of several sequences as one batched forward of a transformers model: a thin
adapter over each sequence's own cache host (kvbench.models.host). The server decodes its
requests with it, the retrieval benchmarks the samples of a case.

Each sequence keeps its own KVBenchCache (one method policy per layer, batch size 1). BatchStep
is a transformers Cache over the same layer of every sequence: a row's new key and value go to
that row's layer host, and kvbench's attention (handed the step through the forward's
`kvbench_cache` keyword) attends each row alone over its own host's read, exactly as a batch-1
step would: no padding of keys, so a row's attention does not depend on the rows beside it. Only
the model's matrix products are shared, which is where one-token decoding spends its time
(reading the weights). RoPE positions come per row from the tokens each policy has seen, so rows
of any length, evicted or compacted, decode together.

On the CPU a step runs at least MIN_ROWS rows, the missing ones blank (no cache; attention gives
them zeros, their logits are dropped): the CPU's matrix product takes another kernel for one to
three rows, whose results differ in the last bits, while from four rows on each row gets the same
bits whatever rows share its step (measured with torch 2.13's CPU build for every weight shape of
the bundled model, 4 to 40 rows). So a sample decodes to the same tokens alone or in any batch.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.models.hf_cache import KVBenchCache, step_length, with_cache
from kvbench.models.batch_lane import lane_step
from kvbench.models.footprint import observe
from kvbench.models.host import BatchRead, append_batch

MIN_ROWS = 4


class BatchLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, layer_idx: int, caches: list[KVBenchCache]):
        super().__init__()
        self.layer_idx = layer_idx
        self.hosts = [cache.layers[layer_idx] for cache in caches]
        self.is_initialized = True
        self.pending: BatchRead | None = None

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[-2] != 1:
            raise ValueError(f"a batched step feeds one token per row, got {key_states.shape[-2]}")
        keys, values = key_states[: len(self.hosts)], value_states[: len(self.hosts)]
        padding = key_states.shape[0] - len(self.hosts)
        lane = lane_step(self.hosts, keys, values)
        if lane is not None:
            self.pending = BatchRead(self.layer_idx, [], padding, lane)
        else:
            self.pending = BatchRead(self.layer_idx, append_batch(self.hosts, keys, values),
                                     padding)
        # attention reads each row's own keys from the BatchRead; these only carry the shapes
        return key_states, value_states

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        # kvbench's attention attends each row over its own keys; this only sizes the model's mask
        return max(host.kept_keys for host in self.hosts) + step_length(query_length), 0

    def get_seq_length(self) -> int:
        return max(host.seen_tokens for host in self.hosts)

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # its name before transformers 5.3


class BatchStep(Cache):
    """The cache of one batched decode forward over `caches` (row i is caches[i])."""

    def __init__(self, caches: list[KVBenchCache]):
        self.caches = caches
        layers = [BatchLayer(i, caches) for i in range(len(caches[0].layers))]
        super().__init__(layers=layers)

    def hosts_layer(self, layer_idx: int) -> bool:
        """Every layer's rows are the method's policies (as CacheHost.hosts_layer)."""
        return True

    def attending_layer(self, module_layer: int) -> int:
        """Every module is its layer's own (plain models only: as KVBenchCache's)."""
        return module_layer

    def read(self, layer_idx: int) -> BatchRead | None:
        """What layer `layer_idx`'s attention reads (kvbench's attention takes it once)."""
        layer = self.layers[layer_idx]
        read, layer.pending = layer.pending, None
        return read

    def forward(self, model, ids: list[int]) -> torch.Tensor:
        """Logits (rows, vocab) of feeding ids[i] to caches[i], in float32."""
        device = model.device
        blank = max(0, MIN_ROWS - len(ids)) if device.type == "cpu" else 0
        x = torch.tensor([[token] for token in ids] + [[0]] * blank, device=device)
        positions = self.positions().to(device)
        positions = torch.cat([positions, positions.new_zeros(blank, 1)])
        logits = self.run(model, x, positions)[: len(ids), -1].float()
        observe(*self.caches)  # the case's footprint: the rows' caches, together
        return logits

    @torch.inference_mode()  # the caches' arrays are inference tensors, read in place
    def run(self, model, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model's logits (rows, 1, vocab) for token ids x and RoPE positions (rows, 1)."""
        return model(x, **with_cache(model, self), position_ids=positions, use_cache=True,
                     kvbench_cache=self, logits_to_keep=1).logits

    def positions(self) -> torch.Tensor:
        """(rows, 1): each row's next RoPE position, the tokens its policies have seen."""
        return torch.tensor([[cache.layers[0].seen_tokens] for cache in self.caches])
