"""What every token-reduction policy shares on torch (the budget is the settings', a ratio of the
prompt or a fixed number of tokens): the policy's full-precision keys and values of the tokens
it keeps (each head its own tokens, the same count per head), an optional additive bias per kept
key, and the post-RoPE queries it observed before compacting.

Positions: seen_tokens counts every token appended, kept or not, so new tokens take RoPE
positions that continue from the original length; the adapters use it.
"""
from __future__ import annotations

import math

import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS, storage_bytes, tensor_bytes
from kvbench.methods.core.contracts import Implementation, LayerCachePolicy
from kvbench.methods.core.tail import Tail, offered
from kvbench.methods.settings.tokens import TokenMethod


class TokenCache(LayerCachePolicy):
    """Holds keys, values (1, H, T, D) and a bias (1, H, T) or None; subclasses decide what to
    keep, with keep()."""

    @classmethod
    def as_implementation(cls) -> type:
        """The torch implementation that holds one of these per layer: what
        `@implements(Settings)` registers when it decorates a cache class (a score-only
        method is its cache alone)."""
        return type(f"Torch{cls.__name__}", (TorchTokenMethod,),
                    {"cache": cls, "__module__": cls.__module__})

    @classmethod
    def queries_read(cls, method: TokenMethod) -> int | None:
        """Implementation.prompt_queries of this policy under `method`'s settings (unless a
        policy says otherwise: every query it is shown)."""
        return None

    def __init__(self):
        # appended in place (kvbench.methods.core.tail): joining copied the layer at every chunk
        self._tails = (Tail(TORCH_ARRAYS), Tail(TORCH_ARRAYS))
        self._reserved = 0  # the tokens the sequence will hold (reserve), 0: not said
        self.bias: torch.Tensor | None = None
        self._seen = 0
        self._fresh = 0  # newest tokens held as appended, since the last keep(): trim can undo
        self.observed: list[torch.Tensor] = []  # (1, Hq, q, D) float32 chunks, oldest first
        self.probe: torch.Tensor | None = None  # queries of tokens appended then taken back

    @property
    def keys(self) -> torch.Tensor | None:
        return self._tails[0].array

    @keys.setter
    def keys(self, kept: torch.Tensor) -> None:
        self._tails[0].replace(kept)

    @property
    def values(self) -> torch.Tensor | None:
        return self._tails[1].array

    @values.setter
    def values(self, kept: torch.Tensor) -> None:
        self._tails[1].replace(kept)

    def reserve(self, tokens: int) -> None:
        self._reserved = tokens

    def append(self, keys, values, queries=None) -> None:
        # room for what it holds and the tokens still to come (after a keep(): not the whole
        # sequence)
        room = self.retained_tokens + max(0, self._reserved - self._seen) if self._reserved else 0
        for tail, x in zip(self._tails, (keys, values)):
            tail.extend(x, room)
        if self.bias is not None:
            self.bias = torch.cat([self.bias, self.bias.new_zeros(keys.shape[:-1])], dim=-1)
        self._seen += keys.shape[-2]
        self._fresh += keys.shape[-2]

    def take_prompt(self, keys, values, key_buffer, value_buffer) -> bool:
        with offered(self._tails, (key_buffer, value_buffer)):
            self.append(keys, values)
        return True

    def attention_inputs(self):
        return self.keys, self.values, self.bias

    def holds_exactly(self, newest: int) -> bool:
        return True  # keys and values as appended; only which tokens stay is chosen

    def observe_queries(self, queries: torch.Tensor) -> None:
        self.observed.append(queries.float())

    def observed_queries(self, last: int | None = None) -> torch.Tensor:
        """The observed queries (1, Hq, n, D), only the newest `last` of them if given."""
        if not self.observed:
            raise RuntimeError(f"{type(self).__name__} saw no queries; the model must run with"
                               " kvbench's attention (kvbench.models.load_model does)")
        if len(self.observed) > 1:  # held joined from here on: the pieces are freed, and a
            self.observed = [torch.cat(self.observed, dim=-2)]  # second read copies nothing
        queries = self.observed[0]
        return queries if last is None else queries[..., -last:, :]

    def trim(self, n: int) -> int:
        """Takes back the newest tokens not yet reduced. Their observed queries become the probe
        (e.g. a task prompt fed, then taken back before compaction)."""
        dropped = min(n, self._fresh)
        if dropped:
            keep = self.keys.shape[-2] - dropped
            for tail in self._tails:
                tail.trim(dropped)
            if self.bias is not None:
                self.bias = self.bias[..., :keep]
            self._seen -= dropped
            self._fresh -= dropped
            if self.observed:
                queries = torch.cat(self.observed, dim=-2)
                self.probe = queries[..., -dropped:, :]
                self.observed = [queries[..., :-dropped, :]]
        return dropped

    def keep(self, index: torch.Tensor, values: torch.Tensor | None = None,
             bias: torch.Tensor | None = None) -> None:
        """Keep, per head, the tokens at `index` (1, H, t), ascending; `values` and `bias` replace
        theirs when given (compaction fits them). Refuses to keep everything or nothing."""
        t = index.shape[-1]
        if not 0 < t < self.keys.shape[-2]:
            raise RuntimeError(f"{type(self).__name__} kept {t} of {self.keys.shape[-2]} tokens;"
                               " a token-reduction policy must keep some and drop some")
        gather = index.unsqueeze(-1)
        self.keys = self.keys.gather(-2, gather.expand(*index.shape, self.keys.shape[-1]))
        if values is None:  # values may be narrower than keys (an MLA latent's RoPE part)
            values = self.values.gather(-2, gather.expand(*index.shape, self.values.shape[-1]))
        self.values = values
        if bias is not None:
            self.bias = bias
        elif self.bias is not None:
            self.bias = self.bias.gather(-1, index)
        self._fresh = 0

    @property
    def scaling(self) -> float:
        """The logit scale of the models kvbench hosts: head_dim ** -0.5."""
        return self.keys.shape[-1] ** -0.5

    @property
    def seen_tokens(self) -> int:
        return self._seen

    @property
    def retained_tokens(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def retained_bytes(self) -> int:
        return tensor_bytes(self.keys, self.values, self.bias)

    def measured_bytes(self) -> int:
        return storage_bytes(self.keys, self.values, self.bias, *self.observed, self.probe)


class ScorerCache(TokenCache):
    """A token-reduction policy that supplies only scores; the rest lives here once (in the
    spirit of kvpress's ScorerPress): the budget, protected sinks (the first tokens) and window
    (the newest), top-k per head or one shared top-k, the gather, and placement of every index
    on the keys' device.

    Subclasses implement scores(); they may protect tokens (protected()), select differently
    (select()) or replace the gather (compact(), e.g. AM's fits). Reduction happens at
    end_prefill, or after every forward of the prompt when the method evicts every chunk; a
    policy with `holds_budget` also evicts after every later step's attention (observe_queries),
    whatever the step's length, so the budget holds through decode."""

    # Reads the prompt's queries (observe()); a policy holding its budget observes them after
    # end_prefill too, as the end-of-step signal.
    reads_queries: bool = True
    holds_budget: bool = False

    def __init__(self, method: TokenMethod):
        super().__init__()
        self.method = method
        self.observes_queries = self.reads_queries
        self.size: int | None = None  # tokens kept per head, once the prompt is reduced

    @classmethod
    def queries_read(cls, method: TokenMethod) -> int | None:
        return None if cls.reads_queries else 0

    def protected(self, size: int) -> tuple[int, int]:
        """(sinks, window): the first and the newest tokens always kept, out of `size`."""
        return 0, 0

    def scores(self) -> torch.Tensor:
        """(H, T) or, for one mask shared by every head, (1, T): a score per held token, higher
        kept first. Only the unprotected span is read."""
        raise NotImplementedError

    def select(self, scores: torch.Tensor, keep: int) -> torch.Tensor:
        """Indices (rows, keep) into `scores`' last axis, ascending."""
        return top_k(scores, keep)

    def compact(self, index: torch.Tensor) -> None:
        """Keep the tokens at `index` (1, H, t)."""
        self.keep(index)

    def observe(self, queries: torch.Tensor) -> None:
        """The queries of the step that just attended (default: keep them all)."""
        super().observe_queries(queries)

    def budget_tokens(self, prompt: int | None = None) -> int | None:
        """Tokens to keep per head from a prompt of `prompt` tokens, by default the tokens
        seen (None: select() decides)."""
        return self.method.tokens(self._seen if prompt is None else prompt)

    def begin_prompt(self, tokens: int) -> None:
        if self.method.evicts_every_chunk():
            self.size = self.budget_tokens(tokens)  # held from the prompt's first forward on

    def append(self, keys, values, queries=None) -> None:
        if self.size is None and self.method.evicts_every_chunk():
            if self.method.budget is None:
                raise RuntimeError(f"{self.method.name} evict every_chunk with a ratio needs the"
                                   " prompt's length before it is fed (begin_prompt, as"
                                   " kvbench.models.session.prefill tells it); give a budget")
            self.size = self.method.budget
        super().append(keys, values, queries)

    def end_prefill(self) -> None:
        self.size = self.budget_tokens()
        if self.size is None or self.keys.shape[-2] > self.size:  # not reduced while prefilling
            self.reduce()
        self.observed, self.probe = [], None
        self.observes_queries = self.holds_budget

    def observe_queries(self, queries: torch.Tensor) -> None:
        if self.reads_queries:
            self.observe(queries)
        if self.size is not None and self.keys.shape[-2] > self.size:  # a budget held in decode
            self.reduce()

    def reduce(self, size: int | None = None) -> None:
        """Keep `size` tokens per head (default: the budget), the protected ones among them."""
        held, heads = self.keys.shape[-2], self.keys.shape[1]
        size = self.size if size is None else size
        sinks, window = (0, 0) if size is None else self.protected(size)
        if size is not None and sinks + window > size:
            raise ValueError(f"{self.method.name}: a budget of {size} tokens does not hold the"
                             f" {sinks} sinks and the window of {window}")
        device = self.keys.device
        parts = [torch.arange(sinks, device=device).expand(heads, -1)]
        if size is None or size > sinks + window:
            scores = self.scores()
            if scores.dim() != 2 or scores.shape[0] not in (1, heads) or scores.shape[1] != held:
                raise RuntimeError(
                    f"{type(self).__name__}.scores() returned shape {tuple(scores.shape)}; it"
                    f" must be (heads, tokens) = ({heads}, {held}), or (1, {held}) for one mask"
                    " shared by the heads")
            scores = scores[:, sinks: held - window]
            keep = None if size is None else size - sinks - window
            parts.append((self.select(scores, keep) + sinks).expand(heads, -1))
        parts.append(torch.arange(held - window, held, device=device).expand(heads, -1))
        self.compact(torch.cat(parts, dim=-1).unsqueeze(0))


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (rows, k) of each row's k highest scores, ascending: kept tokens stay in order."""
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def per_kv_head(queries: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(1, Hq, n, D) queries as (kv_heads, groups * n, D): each KV head's reference queries are
    those of the query heads that read it."""
    _, heads, n, dim = queries.shape
    return queries.reshape(kv_heads, heads // kv_heads * n, dim)


def attention_weights(queries: torch.Tensor, keys: torch.Tensor, scaling: float,
                      causal: bool = True) -> torch.Tensor:
    """softmax(q k^T * scaling) (H, groups, n, T) in float32; queries (1, Hq, n, D), keys
    (1, H, T, D). causal: the queries are the newest n of the T tokens and see only keys up to
    their own position; else every key is visible (queries from after the keys, e.g. a probe)."""
    _, kv_heads, total, dim = keys.shape
    n = queries.shape[-2]
    q = queries.float().reshape(kv_heads, -1, dim)  # a group's query heads as rows of one matrix
    # in place: at a 2k prompt each (H, groups, n, T) temporary is 150 MB, written per layer;
    # one product per KV head, where broadcasting copied its keys once per query head
    logits = torch.bmm(q, keys[0].float().transpose(-1, -2)).view(kv_heads, -1, n, total)
    logits.mul_(scaling)
    if not causal:
        return logits.softmax(-1)
    positions = torch.arange(total, device=keys.device)
    hidden = positions[total - n:].unsqueeze(1) < positions.unsqueeze(0)
    return logits.masked_fill_(hidden, -math.inf).softmax(-1)


# a scorer's working set: one (H, rows, T) array of one block of queries' weights (or logits);
# a step holds a few such arrays at once
SCORE_BLOCK_BYTES = 256 * 2**20
SCORE_BLOCK_MAX = 4 * 2**30
SCORE_FREE_FRACTION = 8  # a block takes at most 1/8 of the GPU's free memory: room for the rest
# ... and at most this share of the scored layer's keys in float32, so the working set grows with
# the cache and never with its square (a window of 32 queries at 32k took 128 MB twice, logits
# and weights, beside a 512 MB plain cache on a 2-layer checkpoint with an 8B's attention), or
# SCORE_KEYS_FLOOR where that is more (short prompts keep blocks of many queries)
SCORE_KEYS_SHARE = 4
SCORE_KEYS_FLOOR = 16 * 2**20


def score_block_bytes(device: torch.device | str) -> int:
    """Bytes of one block of a scorer's queries on `device`: on CUDA an eighth of the free
    memory (torch.cuda.mem_get_info), within SCORE_BLOCK_BYTES .. SCORE_BLOCK_MAX; elsewhere
    (CPU, MPS, MLX's CPU copies) SCORE_BLOCK_BYTES."""
    device = torch.device(device)
    if device.type != "cuda":
        return SCORE_BLOCK_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return min(max(free // SCORE_FREE_FRACTION, SCORE_BLOCK_BYTES), SCORE_BLOCK_MAX)


def query_block_rows(n: int, row_bytes: int, device: torch.device | str,
                     block_bytes: int | None = None, keys_bytes: int = 0) -> int:
    """Queries per block (n where all fit in one) when each query's row of the working set
    takes `row_bytes`: `block_bytes` or, by default, score_block_bytes(device), and at most
    1/SCORE_KEYS_SHARE of `keys_bytes` when given (the scored keys in float32; at least
    SCORE_KEYS_FLOOR); the device is asked only when the n rows exceed SCORE_BLOCK_BYTES (a
    decode step's query never does)."""
    if block_bytes is None:
        cap = (max(keys_bytes // SCORE_KEYS_SHARE, SCORE_KEYS_FLOOR) if keys_bytes
               else SCORE_BLOCK_MAX)
        if n * row_bytes <= min(SCORE_BLOCK_BYTES, cap):
            return n
        block_bytes = min(score_block_bytes(device), cap)
    return min(n, max(1, block_bytes // row_bytes))


def attention_received(queries: torch.Tensor, keys: torch.Tensor, scaling: float,
                       causal: bool = True, block_bytes: int | None = None) -> torch.Tensor:
    """The attention each key receives, summed over every query head of its group and every
    query, (H, T) float32: attention_weights(...).sum((1, 2)), computed over blocks of queries
    whose weights fit in `block_bytes` (default: score_block_bytes of the keys' device, at most
    a quarter of the keys in float32 or 16 MiB), so that a long prompt's scoring holds one block,
    not queries x keys (2 TB a layer at 128k on an 8B model). Where all the queries fit in one
    block, it is that sum itself, bit for bit; in blocks, each query's softmax is the same and only
    the order of the sum over queries differs."""
    _, kv_heads, total, dim = keys.shape
    n = queries.shape[-2]
    groups = queries.shape[1] // kv_heads
    rows = query_block_rows(n, kv_heads * groups * total * 4, keys.device, block_bytes,
                            keys_bytes=kv_heads * total * dim * 4)
    if rows >= n:
        return attention_weights(queries, keys, scaling, causal).sum(dim=(1, 2))
    received = torch.zeros(kv_heads, total, dtype=torch.float32, device=keys.device)
    for start in range(0, n, rows):
        block = queries[:, :, start : start + rows]
        # the block's queries see the keys up to their own position: the first total - n +
        # start + rows of them, as the newest queries of that many tokens
        seen = total - n + start + block.shape[-2] if causal else total
        received[:, :seen] += attention_weights(block, keys[:, :, :seen], scaling,
                                                causal).sum(dim=(1, 2))
    return received


class TorchTokenMethod(Implementation):
    """A token-reduction method on torch: one policy of `cache` per layer, built from the
    settings (and the layer index, for a cache that takes it)."""

    cache: type[LayerCachePolicy]
    @property
    def shares_prefill(self) -> bool:
        # keys and values kept as the model made them, every token until end_prefill, no bias
        # before; evicting every chunk, later chunks attend over what is kept instead
        return not self.settings.evicts_every_chunk()

    @property
    def prompt_queries(self) -> int | None:
        return self.cache.queries_read(self.settings)

    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        return self.cache(self.settings)
