"""One decode step of several requests as one batched forward of a transformers model: a thin
adapter over each request's own cache host (kvbench.models.host).

Each request keeps its own KVBenchCache (one method policy per layer, batch size 1). BatchStep
is a transformers Cache over the same layer of every request: a row's new key and value go to
that row's layer host, and attention gets every row's keys and values right-padded to the
longest, with a padding mask and each row's key bias (kvbench.models.host.BatchRead, handed to
kvbench's attention through the forward's `kvbench_cache` keyword). RoPE positions come per row
from the tokens each policy has seen (the caller passes them as position_ids), so rows of any
length, evicted or compacted, decode together.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvbench.models.hf_cache import KVBenchCache
from kvbench.models.host import BatchRead


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
        rows = [host.append(key_states[row : row + 1], value_states[row : row + 1])
                for row, host in enumerate(self.hosts)]
        lengths = [read.keys.shape[-2] for read in rows]
        if all(read.bias is None for read in rows) and len(set(lengths)) == 1:
            # rows of one length need neither padding nor a mask
            self.pending = BatchRead(self.layer_idx, rows, None, None, lengths)
            return torch.cat([r.keys for r in rows]), torch.cat([r.values for r in rows])
        batch, heads, _, dim = key_states.shape
        longest = max(lengths)
        keys = key_states.new_zeros(batch, heads, longest, dim)
        values = value_states.new_zeros(batch, heads, longest, value_states.shape[-1])
        visible = torch.zeros(batch, 1, 1, longest, dtype=torch.bool, device=key_states.device)
        bias = None
        for row, read in enumerate(rows):
            length = lengths[row]
            keys[row, :, :length] = read.keys[0]
            values[row, :, :length] = read.values[0]
            visible[row, ..., :length] = True
            if read.bias is not None:
                if bias is None:
                    bias = torch.zeros(batch, heads, longest, device=key_states.device)
                # a per-query bias (1, kv_heads, 1, keys) of a one-token step is a key bias
                bias[row, :, :length] = read.bias[0, :, 0] if read.bias.dim() == 4 else read.bias[0]
        self.pending = BatchRead(self.layer_idx, rows, visible, bias, lengths)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # kvbench's attention uses the handed-over padding mask; this only sizes the model's own
        return max(host.kept_keys for host in self.hosts) + query_length, 0

    def get_seq_length(self) -> int:
        return max(host.seen_tokens for host in self.hosts)

    def get_max_length(self) -> int:
        return -1


class BatchStep(Cache):
    """The cache of one batched decode forward over `caches` (row i is caches[i])."""

    def __init__(self, caches: list[KVBenchCache]):
        layers = [BatchLayer(i, caches) for i in range(len(caches[0].layers))]
        super().__init__(layers=layers)

    def read(self, layer_idx: int) -> BatchRead | None:
        """What layer `layer_idx`'s attention reads (kvbench's attention takes it once)."""
        layer = self.layers[layer_idx]
        read, layer.pending = layer.pending, None
        return read

    def forward(self, model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The batched step's logits (rows, 1, vocab); positions (rows, 1), as positions()."""
        return model(ids, past_key_values=self, position_ids=positions, use_cache=True,
                     kvbench_cache=self).logits

    @staticmethod
    def positions(caches: list[KVBenchCache]) -> torch.Tensor:
        """(rows, 1): each row's next RoPE position, the tokens its policies have seen."""
        return torch.tensor([[cache.layers[0].seen_tokens] for cache in caches])
