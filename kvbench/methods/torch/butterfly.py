"""`butterfly` on torch: Compressed Butterfly sparse attention, a sliding window plus block-mean summaries
of the sink block and one deterministic partner block per layer."""
from __future__ import annotations

import random
import typing

import torch

from kvbench.backends.torch_arrays import storage_bytes
from kvbench.config.registry import did_you_mean
from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.settings.base import implements
from kvbench.methods.settings.butterfly import Butterfly, PartnerRule

PARTNER_RULES = typing.get_args(PartnerRule)


def stages(n_blocks: int) -> int:
    """max(1, ceil(log2 n_blocks)), in integers."""
    return max(1, (max(n_blocks, 1) - 1).bit_length())


def partner(rule: str, b: int, layer_idx: int, n_blocks: int, seed: int = 0) -> int | None:
    """The partner block of query block `b` in layer `layer_idx`, or None.

    stage = layer_idx mod max(1, ceil(log2 n_blocks)). Rules: `causal_shift` b - 2^stage (the
    butterfly); `xor` b XOR 2^stage, only when that is earlier than b; `fixed_stride` b - 1;
    `random` an earlier block drawn uniformly from [0, b) by a generator seeded with
    (seed, layer_idx, b), so the same call always gives the same block; `local_only` none.
    A candidate below 0 is None. Visibility (whether the block has ended early enough) is
    `block_visible`'s business, not this function's.
    """
    if rule not in PARTNER_RULES:
        raise ValueError(f"unknown partner rule {rule!r}.{did_you_mean(rule, PARTNER_RULES)}"
                         f" Known: {', '.join(PARTNER_RULES)}.")
    if rule == "local_only" or b <= 0:
        return None
    shift = 1 << (layer_idx % stages(n_blocks))
    if rule == "causal_shift":
        p = b - shift
    elif rule == "xor":
        p = b ^ shift
        p = p if p < b else -1
    elif rule == "fixed_stride":
        p = b - 1
    else:  # random; str seeds hash with sha512, so this does not depend on PYTHONHASHSEED
        p = random.Random(f"butterfly:{seed}:{layer_idx}:{b}").randrange(b)
    return p if p >= 0 else None


def block_visible(p: int, q: int, block_size: int, window: int) -> bool:
    """Block p (tokens p*B .. (p+1)*B - 1) is visible to the query at position q iff it ends at
    or before q - W + 1, the oldest token of q's window."""
    return p >= 0 and (p + 1) * block_size - 1 <= q - window + 1


def visible_summaries(rule: str, q: int, block_size: int, window: int, layer_idx: int,
                      seed: int = 0) -> list[int]:
    """The blocks whose summaries the query at position q attends to, ascending: the sink block
    0 and the partner of q's block q // B (N = q // B + 1 blocks touched so far), each only if
    visible; a partner equal to 0 is the sink, once. `local_only`: none, not even the sink."""
    if rule == "local_only":
        return []
    b = q // block_size
    found = {p for p in (0, partner(rule, b, layer_idx, b + 1, seed))
             if p is not None and block_visible(p, q, block_size, window)}
    return sorted(found)


class ButterflyCache(LayerCachePolicy):
    """One layer under Compressed Butterfly attention.

    Holds: the raw tail (the newest tokens, K and V at the model's dtype); one float32 summary
    (mean of the block's keys, mean of its values) per completed block of `block_size` tokens,
    for every block, whatever the rule; and the float32 running sums of the open (incomplete)
    block, turned into its summary when the block completes. Summaries are built from the
    appended tensors as they arrive, so a block completed inside a long append and one
    completed over many one-token appends get the same mean.

    attention_inputs(): keys/values = [the S summaries, cast to the model's dtype] + [the R raw
    tokens], (batch, kv_heads, S + R, head_dim), and a per-query bias (batch, kv_heads, q, S + R),
    q = tokens in the latest append: 0 where the query may attend, -inf elsewhere. It encodes
    causality, the window [q - W + 1, q] over the raw tokens and the visible summaries; it
    replaces the model's causal mask. One softmax runs over both streams.

    Raw tokens are dropped only at the start of the next append (all but the W - 1 newest, which
    the next query's window needs) and at end_prefill() (all but the W newest), never inside
    the append whose queries may still need them. Between one-token steps the raw tail is W
    tokens.
    """

    def __init__(self, method: Butterfly, layer_idx: int):
        self.method = method
        self.layer_idx = layer_idx
        self.raw_k: torch.Tensor | None = None
        self.raw_v: torch.Tensor | None = None
        self.summary_k: torch.Tensor | None = None  # (batch, kv_heads, S, head_dim) float32
        self.summary_v: torch.Tensor | None = None
        self.open_k: torch.Tensor | None = None  # (batch, kv_heads, head_dim) float32 sums
        self.open_v: torch.Tensor | None = None
        self._seen = 0
        self._last_append = 0

    # -- state -------------------------------------------------------------------------------

    @property
    def raw_tokens(self) -> int:
        return 0 if self.raw_k is None else self.raw_k.shape[-2]

    @property
    def summary_slots(self) -> int:
        return 0 if self.summary_k is None else self.summary_k.shape[-2]

    @property
    def open_tokens(self) -> int:
        """Tokens in the open block's running sums."""
        return self._seen % self.method.block_size

    @property
    def seen_tokens(self) -> int:
        return self._seen

    @property
    def retained_tokens(self) -> int:
        return self.raw_tokens

    # -- appending ---------------------------------------------------------------------------

    def append(self, keys, values, queries=None) -> None:
        n = keys.shape[-2]
        if n == 0:
            return
        # The first new query (position seen) needs the W - 1 tokens before it.
        old_k, old_v = self._tail(self.method.window - 1)
        # new tensors either way: the tail held never pins the model's or the old buffers
        self.raw_k = keys.clone() if old_k is None else torch.cat([old_k, keys], dim=-2)
        self.raw_v = values.clone() if old_v is None else torch.cat([old_v, values], dim=-2)
        self._summarise(keys, values)
        self._seen += n
        self._last_append = n

    def end_prefill(self) -> None:
        keep = min(self.method.window, self.raw_tokens)
        if keep < self.raw_tokens:
            self.raw_k, self.raw_v = self._tail(keep)
            # a copy, so the kept tail does not pin the storage of the whole prompt
            self.raw_k, self.raw_v = self.raw_k.clone(), self.raw_v.clone()

    def _tail(self, keep: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.raw_k is None:
            return None, None
        start = max(self.raw_tokens - keep, 0)
        return self.raw_k[..., start:, :], self.raw_v[..., start:, :]

    def _summarise(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Adds the new tokens to the open block's sums; every block they complete becomes a
        summary (sum / B in float32)."""
        B, n = self.method.block_size, keys.shape[-2]
        done: list[tuple[torch.Tensor, torch.Tensor]] = []
        i = 0
        if self.open_tokens:  # finish (or extend) the open block
            take = min(B - self.open_tokens, n)
            self.open_k = self.open_k + keys[..., :take, :].float().sum(-2)
            self.open_v = self.open_v + values[..., :take, :].float().sum(-2)
            i = take
            if self.open_tokens + take == B:
                done.append((self.open_k.unsqueeze(-2) / B, self.open_v.unsqueeze(-2) / B))
                self.open_k = self.open_v = None
        full = (n - i) // B
        if full:
            span = slice(i, i + full * B)
            k, v = keys[..., span, :].float(), values[..., span, :].float()
            done.append((k.unflatten(-2, (full, B)).sum(-2) / B,
                         v.unflatten(-2, (full, B)).sum(-2) / B))
            i += full * B
        if i < n:  # start a new open block
            self.open_k = keys[..., i:, :].float().sum(-2)
            self.open_v = values[..., i:, :].float().sum(-2)
        if done:
            ks = [k for k, _ in done]
            vs = [v for _, v in done]
            if self.summary_k is not None:
                ks.insert(0, self.summary_k)
                vs.insert(0, self.summary_v)
            self.summary_k = torch.cat(ks, dim=-2)
            self.summary_v = torch.cat(vs, dim=-2)

    # -- reading -----------------------------------------------------------------------------

    def attention_inputs(self):
        if self.raw_k is None:
            raise RuntimeError("ButterflyCache.attention_inputs() before any append")
        dtype = self.raw_k.dtype
        if self.summary_k is None:
            keys, values = self.raw_k, self.raw_v
        else:
            keys = torch.cat([self.summary_k.to(dtype), self.raw_k], dim=-2)
            values = torch.cat([self.summary_v.to(dtype), self.raw_v], dim=-2)
        visible = self.visibility(self._last_append)
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=keys.device)
        bias = bias.masked_fill(~visible, float("-inf"))
        return keys, values, bias.expand(*keys.shape[:2], *visible.shape)

    def visibility(self, queries: int) -> torch.Tensor:
        """(queries, S + R) bool: which of attention_inputs()'s keys each of the newest `queries`
        positions may attend to."""
        m = self.method
        B, W = m.block_size, m.window
        S, R = self.summary_slots, self.raw_tokens
        device = self.raw_k.device
        first_q, last_q = self._seen - queries, self._seen - 1
        q = torch.arange(first_q, last_q + 1, device=device)
        oldest = q - W + 1  # oldest position in each query's window
        # summaries: the sink and each query block's partner, when they ended at or before oldest
        if m.partner_rule == "local_only" or S == 0:
            summaries = torch.zeros(queries, S, dtype=torch.bool, device=device)
        else:
            first = first_q // B
            partners = torch.tensor(
                [-1 if (p := partner(m.partner_rule, b, self.layer_idx, b + 1, m.seed)) is None
                 else p for b in range(first, last_q // B + 1)], device=device)
            p_of_q = partners[q // B - first]
            cols = torch.arange(S, device=device)
            ends = (cols + 1) * B - 1
            summaries = (ends[None, :] <= oldest[:, None]) & (
                (cols[None, :] == 0) | (cols[None, :] == p_of_q[:, None]))
        # raw tokens: causal, and inside the window
        pos = torch.arange(self._seen - R, self._seen, device=device)
        raw = (pos[None, :] <= q[:, None]) & (pos[None, :] >= oldest[:, None])
        return torch.cat([summaries, raw], dim=-1)

    # -- accounting --------------------------------------------------------------------------

    @property
    def retained_bytes(self) -> int:
        """Raw tail K and V at their dtype + summaries (float32) + open-block sums (float32)."""
        if self.raw_k is None:
            return 0
        batch, heads = self.raw_k.shape[:2]
        dk, dv = self.raw_k.shape[-1], self.raw_v.shape[-1]
        raw = self.raw_tokens * batch * heads * (
            dk * self.raw_k.element_size() + dv * self.raw_v.element_size())
        f32_rows = self.summary_slots + (1 if self.open_tokens else 0)
        return raw + f32_rows * batch * heads * (dk + dv) * 4

    def measured_bytes(self) -> int:
        return storage_bytes(self.raw_k, self.raw_v, self.summary_k, self.summary_v,
                             self.open_k, self.open_v)


@implements(Butterfly)
class TorchButterfly(Implementation):
    settings: Butterfly

    def new_layer_cache(self, layer_idx: int) -> ButterflyCache:
        return ButterflyCache(self.settings, layer_idx)
