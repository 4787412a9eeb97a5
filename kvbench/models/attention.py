"""kvbench's attention function for transformers models: SDPA, unless the cache layer that was
just updated holds a read plain SDPA cannot serve (kvbench.models.host.AttentionRead: a key bias,
sparse-V, queries the policy observes, the packed cache for the fused decode attention, a read
too large to hold whole, in parts (kvbench.models.part_attention); or a batched step's
BatchRead, whose rows are attended one by one, except those a batched kernel, the CPU one or
the Triton one, reads all at once).

Models are loaded with attn_implementation="kvbench"; the cache reaches this function as the
forward's `kvbench_cache` keyword (KVBenchCache.forward passes it; it answers read(layer) and
hosts_layer(layer)), and the read is taken from the cache's layer by the module's layer
index. With nothing held (a DynamicCache, or a policy with none of these), this is exactly
transformers' SDPA attention, so the identity method stays bit-exact; a policy that only
observes queries also gets SDPA's output. A layer whose model attention SDPA does not compute
(logit softcapping, Gemma 2; learned sinks, gpt-oss's `s_aux`) is attended by biased_attention
with the same softcap and sinks, on every read; the fused decode attention takes them too.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.models.biased_attention import biased_attention as attention_on
from kvbench.models.host import AttentionRead, BatchRead
from kvbench.models.indexed_layer import selected_mask
from kvbench.models.part_attention import part_attention

NAME = "kvbench"


def kvbench_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      kvbench_cache: Any = None, **kwargs):
    # transformers' order of the arguments (sdpa_attention_forward's): kvpress's wrapper of
    # every attention function passes dropout by position
    layer = None if kvbench_cache is None else kvbench_cache.attending_layer(module.layer_idx)
    read = None if kvbench_cache is None else kvbench_cache.read(layer)
    if query.shape[-2] == 1 and kvbench_cache is not None and kvbench_cache.hosts_layer(layer):
        # one newest query sees every key its policy kept; a model that builds its mask at
        # one-token steps (Falcon-H1) sizes it before the policy made room for the token
        attention_mask = None
    indices = kwargs.pop("indices", None)  # an indexer's top-k keys (DeepSeek-V3.2's DSA)
    if indices is not None:
        if getattr(read, "packed", None) is not None:
            raise RuntimeError(f"layer {layer}: the fused decode read cannot take the indexer's"
                               " selection (LayerKind.unfused_because keeps it off)")
        # as the model folds it for eager and SDPA: only the selected keys are seen
        attention_mask = selected_mask(attention_mask, indices, key.shape[-2])
    features = _features(kwargs)
    if read is None and features:
        return biased_attention(query, key, value, attention_mask, None, scaling,
                                **features)[0].transpose(1, 2).contiguous(), None
    if read is None:
        return sdpa(module, query, key, value, attention_mask, dropout=dropout,
                    scaling=scaling, **kwargs)
    if read.layer_idx != layer:
        raise RuntimeError(f"attention of layer {layer} got the cache state of layer"
                           f" {read.layer_idx}")
    if isinstance(read, BatchRead):
        return _attend_rows(module, read, query, scaling, dropout, features, **kwargs), None
    return _attend(module, read, query, key, value, attention_mask, scaling, dropout, features,
                   **kwargs), None


def _features(kwargs: dict) -> dict:
    """What the model's own attention adds to softmax(q k^T) that SDPA lacks: softcap, sinks
    (taken out of kwargs, which go on to SDPA)."""
    features = {"softcap": kwargs.pop("softcap", None), "sinks": kwargs.pop("s_aux", None)}
    return {name: value for name, value in features.items() if value is not None}


def _attend_rows(module, read: BatchRead, query, scaling, dropout, features: dict,
                 **kwargs) -> torch.Tensor:
    """Each row alone, as its batch-1 step (one token: no mask), except that the rows whose
    packed caches a batched kernel reads (the CPU one's, or the Triton one's: ragged rows, a
    launch per segment for all of them), with the same formats, go through it together (one
    call instead of one per row; a row's bits do not depend on the rows beside it), and the
    lane's rows all together."""
    if read.lane is not None:
        out = read.lane.attend(query[: len(read.lane.lines)], scaling).transpose(1, 2)
        return torch.cat([out, out.new_zeros(read.padding, *out.shape[1:])])
    outs: list = [None] * len(read.rows)
    together: dict[tuple, list[int]] = {}  # (kernel, the rows' layouts): rows read at once
    for i, row in enumerate(read.rows):
        key = _batch_key(row, features)
        if key is None:
            outs[i] = _attend(module, row, query[i : i + 1], row.keys, row.values, None,
                              scaling, dropout, features, **kwargs)
        else:
            together.setdefault(key, []).append(i)
    for (kernel, _), indices in together.items():
        segments = [read.rows[i].packed.segments for i in indices]
        if kernel == "cpu":
            from kvbench.kernels.cpu.batched import decode_attention_rows

            out = decode_attention_rows(query[indices], segments, scaling)
        else:
            from kvbench.kernels.triton.rows import decode_attention_rows

            out = decode_attention_rows(query[indices], segments, scaling=scaling, **features)
        for i, row_out in zip(indices, out.transpose(1, 2)):
            outs[i] = row_out[None]
    outs += [torch.zeros_like(outs[0])] * read.padding
    return torch.cat(outs)


def _batch_key(row: AttentionRead, features: dict) -> tuple | None:
    """(kernel, layouts) of a row that a batched kernel reads with the rows of the same key:
    the CPU one (plain softmax: no softcap or sinks) or the Triton one (one launch per segment
    for all of them); None: read alone. The kernels are imported only when a row is read by
    one."""
    if row.packed is None:
        return None
    if row.packed.kernel == "cpu":
        if features:
            return None
        from kvbench.kernels.cpu.batched import batch_formats

        formats = batch_formats(row.packed.segments)
        return None if formats is None else ("cpu", tuple(map(id, formats)))
    from kvbench.kernels.triton.rows import row_formats

    formats = row_formats(row.packed.segments)
    return None if formats is None else ("triton", formats)


def _attend(module, read: AttentionRead, query, key, value, attention_mask, scaling, dropout,
            features: dict, **kwargs) -> torch.Tensor:
    """Attention over one sequence's read, (batch, queries, heads, dim) as SDPA returns it;
    `features`: the model's softcap and sinks (_features)."""
    if read.parts is not None:
        out = part_attention(query, read.parts, attention_mask, read.part_keys, scaling,
                             **features)
        read.attended(query)
        return out.transpose(1, 2).contiguous()
    if read.packed is not None:  # one newest query over the packed cache: no mask needed
        out = decode_attention_of(read.packed.kernel)(query, read.packed.segments,
                                                      scaling=scaling, **features)
        return out.transpose(1, 2).contiguous()
    sparse = None
    # sparse-V skips rows at one-query steps only: several queries are plain attention
    if features or (read.bias is not None and not _one_mask_for_every_head(read.bias)) \
            or (read.skip_below and query.shape[-2] == 1):
        out, sparse = biased_attention(query, key, value, attention_mask, read.bias, scaling,
                                       read.skip_below, **features)
        out = out.transpose(1, 2).contiguous()
    elif read.bias is None:
        out = sdpa(module, query, key, value, attention_mask, dropout=dropout,
                   scaling=scaling, **kwargs)[0]
    else:
        # a policy's own causal mask (streamingllm making room mid-prefill): SDPA never holds
        # the chunk's float32 attention weights, which set the peak of a chunked prefill
        out = sdpa(module, query, key, value, read.bias[:, :1], dropout=dropout,
                   scaling=scaling, **kwargs)[0]
    read.attended(query, sparse)
    return out


def sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, except for several queries on the CPU under a mask (a
    later prefill chunk, a policy's own mask): there the query heads of a group read their key head in place
    (enable_gqa: the same bits as repeating it, measured with torch 2.13's CPU build) where
    transformers repeats keys and values for every query head, a copy of the layer's cache
    as many times as the group is wide."""
    if (query.device.type != "cpu" or attention_mask is None or query.shape[-2] == 1
            or query.shape[1] == key.shape[1] or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _one_mask_for_every_head(bias: torch.Tensor | None) -> bool:
    """A per-query bias (B, Hkv, q, T) that is one mask repeated over the heads (expanded)."""
    return bias is not None and bias.dim() == 4 and (bias.shape[1] == 1 or bias.stride(1) == 0)


def decode_attention_of(kernel: str):
    """The fused decode attention named by a PackedRead's kernel ("cpu" or "triton"), imported
    only when first asked for: decode_attention(query, segments, bias=None, scaling=None,
    softcap=None, sinks=None)."""
    if kernel == "cpu":
        from kvbench.kernels.cpu.attention import decode_attention
    else:
        from kvbench.kernels.triton.segments import decode_attention
    return decode_attention


def biased_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, bias: torch.Tensor | None,
                     scaling: float | None = None, skip_below: float = 0.0,
                     softcap: float | None = None, sinks: torch.Tensor | None = None):
    """kvbench.models.biased_attention.biased_attention on torch tensors: the float reference."""
    return attention_on(TORCH_ARRAYS, query, key, value, mask, bias, scaling, skip_below,
                        softcap, sinks)


AttentionInterface.register(NAME, kvbench_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
