"""One host for a method's layer policies, whatever drives them: it appends each step's keys and
values to the layer's policy, checks what the policy hands attention, and says what that layer's
attention must read (an AttentionRead). transformers (kvbench.models.hf_cache), mlx-lm
(kvbench.models.mlx_host), the batched decode step (kvbench.models.batch_step) and the
conformance kit (kvbench.testing) are thin adapters over it.

A read that plain attention cannot serve (a key bias, sparse-V, queries the policy observes, the
packed cache for the fused decode attention, or a read in parts: LayerCachePolicy.attention_parts,
where the adapter's attention takes them, `part_bytes`) is held by the layer until that layer's
attention takes it; the adapters hand attention the cache explicitly (transformers: the
`kvbench_cache` keyword of the model's forward, mlx-lm: the layer itself), never through
thread-local state. A read left untaken is an error at the layer's next step: the model's
attention did not go through kvbench's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvbench.kernels.formats import PackedRead
from kvbench.methods.core.codec_cache import append_rows
from kvbench.methods.core.contracts import LayerCachePolicy
from kvbench.methods.core.newest import newest_dropped, newest_replaced
from kvbench.methods.core.read_parts import as_part


@dataclass
class AttentionRead:
    """What one layer's attention reads for the step just appended: the policy's keys, values and
    bias (per key (batch, kv_heads, keys), or per query (batch, kv_heads, queries, keys) in place
    of the causal mask) or, for the fused decode attention, its packed segments; and the policy,
    which may ask for sparse-V and to see the step's queries."""

    layer_idx: int
    policy: LayerCachePolicy
    keys: Any = None
    values: Any = None
    bias: Any = None
    packed: PackedRead | None = None  # read instead of keys and values
    # or these, each a function making its (keys, values), `part_keys` keys in all
    # (LayerCachePolicy.attention_parts)
    parts: list | None = None
    part_keys: int = 0
    # another layer's attention over this one's cache (LayerKind.reads): its queries and
    # what it skips are not the policy's to hear
    shared: bool = False

    @property
    def skip_below(self) -> float:
        """Sparse-V: value rows under this softmax weight are skipped (0: off)."""
        return self.policy.value_skip_threshold

    @property
    def plain(self) -> bool:
        """Plain softmax attention over keys and values serves it (the model's own)."""
        return (self.packed is None and self.parts is None and self.bias is None
                and not self.skip_below and not self.policy.observes_queries)

    def attended(self, queries: Any, sparse: tuple | None = None) -> None:
        """After attention: the policy hears what sparse-V skipped (rows skipped, rows, output
        error) and sees the step's queries, where it asked for them."""
        if self.shared:
            return
        if sparse is not None:
            self.policy.record_sparse_v(*sparse)
        if self.policy.observes_queries:
            self.policy.observe_queries(queries)


@dataclass
class BatchRead:
    """One layer of a batched one-token step (kvbench.models.batch_step): each row's read, which
    attention serves row by row as a batch-1 step's, or the lane's read of every row
    (kvbench.models.batch_lane.LaneRead); then `padding` rows nobody reads."""

    layer_idx: int
    rows: list[AttentionRead]
    padding: int = 0
    lane: Any = None


class LayerHost:
    """One layer's policy as a model drives it. Adapters subclass it with their framework's layer
    protocol, set `arrays` (their backend's kvbench.backends.arrays.Arrays) and call append()
    from it.

    exact_step (the method's prefill_reads "exact"): attention reads the step's own keys and
    values as the model made them, the earlier tokens as the policy stores them. Every policy
    returns its tokens in order, the step's last, so where it does not hold them as appended
    (holds_exactly) their stored form is replaced there."""

    arrays: Any = None
    exact_step = False  # CacheHost sets it from the method
    # a read larger than this comes in parts (LayerCachePolicy.attention_parts); 0: the
    # adapter's attention reads none
    part_bytes = 0

    def __init__(self, policy: LayerCachePolicy, layer_idx: int):
        self.policy = policy
        self.layer_idx = layer_idx
        self.started = False  # a policy need not answer before its first append
        self.pending: AttentionRead | None = None
        # the step's read, kept for the layers that read this one's cache (only where there
        # are: it holds the step's decoded keys and values until the next step)
        self.read_by_others = False
        self.last_read: AttentionRead | None = None

    def append(self, keys: Any, values: Any, mask_kv_length: int | None = None,
               fused: bool = False) -> AttentionRead:
        """Append one step and say what attention reads. mask_kv_length: the keys the model's one
        shared causal mask was sized for (None: none). fused: a one-token step may be read as
        the policy stores it (its attention_segments) by the fused decode attention."""
        self.check_read()
        self.policy.append(keys, values)
        return self.read_appended(keys, values, mask_kv_length, fused)

    def check_read(self) -> None:
        """Refuse a new step while the last one's read was left untaken."""
        if self.pending is not None:
            stale, self.pending = self.pending, None
            raise RuntimeError(
                f"the model's attention did not read the kvbench cache's state of layer"
                f" {stale.layer_idx} (a key bias, sparse-V, queries or packed segments); load"
                " the model with kvbench.models.load_model (or load_mlx_model), which installs"
                " kvbench's attention, and run it through the session or the cache's forward")

    def read_appended(self, keys: Any, values: Any, mask_kv_length: int | None,
                      fused: bool) -> AttentionRead:
        """What attention reads after the policy took the step `keys`, `values` (append's);
        then the policy drops what no later query reads (LayerCachePolicy.after_read: a
        sliding window's oldest tokens)."""
        read = self._read_appended(keys, values, mask_kv_length, fused)
        self.policy.after_read()
        return read

    def _read_appended(self, keys: Any, values: Any, mask_kv_length: int | None,
                       fused: bool) -> AttentionRead:
        policy, steps = self.policy, keys.shape[-2]
        self.started = True
        replace = self.exact_step and not policy.holds_exactly(steps)
        if fused and steps == 1 and not policy.value_skip_threshold \
                and not policy.observes_queries:
            packed = policy.attention_segments((keys, values) if replace else None)
            if packed is not None:
                check_attention_inputs(policy, self.layer_idx,
                                       (*keys.shape[:-2], packed.tokens, keys.shape[-1]), None,
                                       1, mask_kv_length)
                return AttentionRead(self.layer_idx, policy, packed=packed)
        if self.part_bytes and not (self.read_by_others or policy.observes_queries
                                    or (policy.value_skip_threshold and steps == 1)):
            parts = policy.attention_parts(self.part_bytes)
            if parts is not None:
                if replace:
                    parts = [*newest_dropped(parts, steps), as_part(keys, values)]
                kept = policy.retained_tokens + policy.summary_slots
                check_attention_inputs(policy, self.layer_idx,
                                       (*keys.shape[:-2], kept, keys.shape[-1]), None, steps,
                                       mask_kv_length)
                return AttentionRead(self.layer_idx, policy, parts=parts, part_keys=kept)
        read = policy.attention_inputs_exact(keys, values) if replace else None
        out_keys, out_values, bias = read or policy.attention_inputs()
        check_attention_inputs(policy, self.layer_idx, tuple(out_keys.shape),
                               None if bias is None else tuple(bias.shape), steps, mask_kv_length)
        if replace and read is None:
            out_keys = self.arrays.concat(newest_replaced([out_keys], keys))
            out_values = self.arrays.concat(newest_replaced([out_values], values))
        return AttentionRead(self.layer_idx, policy, out_keys, out_values, bias)

    def ingest(self, keys: Any, values: Any, queries: Any, buffers: tuple | None = None) -> None:
        """A prompt whose forwards ran elsewhere (kvbench.models.shared_prefill): the policy gets
        what those steps' appends and attention would have handed it (queries: the newest
        tokens' that it reads, None for none); `buffers`: the arrays whose first tokens are
        `keys` and `values`, handed over with them where the policy takes them
        (LayerCachePolicy.take_prompt)."""
        if buffers is None or not self.policy.take_prompt(keys, values, *buffers):
            self.policy.append(keys, values)
        self.started = True
        if self.policy.observes_queries and queries is not None:
            self.policy.observe_queries(queries)
        self.policy.after_read()

    def filled_elsewhere(self) -> None:
        """The policy was filled without an append (a library ran the prompt's forward:
        kvbench.methods.external.library_prefill)."""
        self.started = True

    def hold(self, read: AttentionRead) -> AttentionRead:
        """Keep `read` for this layer's attention, unless plain attention serves it."""
        if self.read_by_others:
            self.last_read = read
        if not read.plain:
            self.pending = read
        return read

    def take_read(self) -> AttentionRead | None:
        """Called by kvbench's attention: this layer's held read, once."""
        read, self.pending = self.pending, None
        return read

    def trim(self, n: int) -> int:
        return self.policy.trim(n) if self.started else 0

    @property
    def seen_tokens(self) -> int:
        """RoPE position of the next token: every token seen, kept or not."""
        return self.policy.seen_tokens if self.started else 0

    @property
    def kept_keys(self) -> int:
        """Keys attention_inputs() returns: block summaries and retained tokens."""
        if not self.started:
            return 0
        return self.policy.retained_tokens + self.policy.summary_slots


def append_batch(hosts: list[LayerHost], keys: Any, values: Any) -> list[AttentionRead]:
    """One token of each of several sequences, row i of keys and values (rows, kv_heads, 1,
    head_dim) to hosts[i]: the policies take their rows together
    (kvbench.methods.core.codec_cache.append_rows packs them in one encode), then each row says
    what its attention reads, as a fused one-token step's."""
    for host in hosts:
        host.check_read()
    append_rows([host.policy for host in hosts], keys, values)
    return [host.read_appended(keys[row : row + 1], values[row : row + 1], None, fused=True)
            for row, host in enumerate(hosts)]


class CacheHost:
    """Every layer's host for one sequence: `layers[i]` built by `make_layer(policy, i)` from
    `method.new_layer_cache(i)` (method: a method's implementation on the adapter's backend)
    for the layers a method compresses (`method.new_window_cache(i, windows[i])` for a sliding
    window of windows[i] tokens that it holds: kvbench.models.layer_kinds.hosted_layers), and
    library_layers[i], the library's own layer object, for the others (sliding-window,
    linear-attention and Mamba layers: kvbench.models.layer_kinds), which the model drives as
    it drives them without kvbench.

    decoded_reads: ask every layer's policy for its decoded-once read path
    (LayerCachePolicy.keep_decoded: the same attention inputs, bit for bit, without decoding the
    packed cache at every step); the attribute `decoded_reads` then says whether any policy took
    it, i.e. which path runs."""

    layers: list

    def __init__(self, method: Any, num_layers: int, make_layer, decoded_reads: bool = False,
                 library_layers: dict[int, Any] | None = None,
                 readers: dict[int, int] | None = None,
                 windows: dict[int, int] | None = None):
        library, windows = library_layers or {}, windows or {}
        self.readers = readers or {}  # {layer: the layer whose cache it reads}
        self.windows = windows  # {layer: its sliding window} of the windows a policy holds

        def policy(i: int) -> LayerCachePolicy:
            return (method.new_window_cache(i, windows[i]) if i in windows
                    else method.new_layer_cache(i))

        self.layers = [library[i] if i in library else make_layer(policy(i), i)
                       for i in range(num_layers)]
        self.hosts: list[LayerHost] = [layer for layer in self.layers
                                       if isinstance(layer, LayerHost)]
        self.library_layers = [layer for layer in self.layers if not isinstance(layer, LayerHost)]
        for host in self.hosts:
            host.exact_step = method.prefill_reads == "exact"
            host.read_by_others = host.layer_idx in self.readers.values()
        self.decoded_reads = decoded_reads and any(
            [host.policy.keep_decoded() for host in self.hosts])

    def read(self, layer_idx: int) -> AttentionRead | None:
        """What layer `layer_idx`'s attention reads now (None: plain attention); a layer that
        reads another's cache reads what that layer's attention read this step, where plain
        attention over the keys handed on does not serve it (packed segments, a bias)."""
        if layer_idx in self.readers:
            owner = self.layers[self.readers[layer_idx]]
            read = owner.last_read if isinstance(owner, LayerHost) else None
            if read is None or read.plain:
                return None
            return replace(read, layer_idx=layer_idx, shared=True)
        layer = self.layers[layer_idx]
        return layer.take_read() if isinstance(layer, LayerHost) else None

    def hosts_layer(self, layer_idx: int) -> bool:
        """Whether a method's policy (not the library) holds layer `layer_idx`'s keys (or those
        of the layer whose cache it reads)."""
        return isinstance(self.layers[self.readers.get(layer_idx, layer_idx)], LayerHost)

    @property
    def policies(self) -> list[LayerCachePolicy]:
        """The method's policies, one per layer it compresses."""
        return [host.policy for host in self.hosts]

    def begin_prompt(self, tokens: int) -> None:
        for policy in self.policies:
            policy.begin_prompt(tokens)

    def reserve(self, tokens: int) -> None:
        """The sequence will hold at most `tokens` tokens (LayerCachePolicy.reserve)."""
        for policy in self.policies:
            policy.reserve(tokens)

    def end_prefill(self) -> None:
        for policy in self.policies:
            policy.end_prefill()

    def library_bytes(self) -> int:
        """Bytes the library's own layers hold (the adapter counts them: their arrays)."""
        return 0

    def accounted_bytes(self) -> int:
        """What the methods' layouts store, keys and values, summed over layers, and what the
        library's layers hold (a sliding window, a recurrent state), as they hold it."""
        return sum(policy.retained_bytes for policy in self.policies) + self.library_bytes()

    def measured_bytes(self) -> int:
        """Bytes of the arrays the policies and the library's layers actually hold right now."""
        return sum(policy.measured_bytes() for policy in self.policies) + self.library_bytes()

    def plain_tokens(self) -> int:
        """Tokens the plain cache would hold in the policies' layers, summed: every token seen,
        but in a sliding-window layer the window's last W - 1 (what transformers' window layer
        keeps between steps)."""
        return sum(min(host.seen_tokens, self.windows[host.layer_idx] - 1)
                   if host.layer_idx in self.windows else host.seen_tokens
                   for host in self.hosts)

    def retained_tokens(self) -> list[int]:
        return [policy.retained_tokens for policy in self.policies]

    def counters(self) -> dict[str, float]:
        """The policies' counters, summed over layers."""
        totals: dict[str, float] = {}
        for policy in self.policies:
            for name, value in policy.counters().items():
                totals[name] = totals.get(name, 0.0) + value
        return totals


def check_attention_inputs(policy: LayerCachePolicy, layer_idx: int, keys_shape: tuple,
                           bias_shape: tuple | None, query_length: int,
                           mask_kv_length: int | None) -> None:
    """A policy that keeps nothing, more than it saw, or not what it reports, or whose bias does
    not fit the keys it returned, is a bug: checked after every append.
    mask_kv_length: the keys the model's one shared causal mask was sized for (None: none yet).
    A one-token step needs no mask; a longer one uses it, which only fits if this layer returned
    as many keys, unless its per-query bias replaces the mask."""
    name = type(policy).__name__
    seen, retained, summaries = policy.seen_tokens, policy.retained_tokens, policy.summary_slots
    if not 0 < retained <= seen:
        raise RuntimeError(f"layer {layer_idx}: {name} retains {retained} tokens after seeing"
                           f" {seen} (must be between 1 and the tokens seen)")
    if keys_shape[-2] != retained + summaries:
        raise RuntimeError(f"layer {layer_idx}: {name} returned {keys_shape[-2]} keys but reports"
                           f" {retained} retained tokens and {summaries} summaries")
    allowed = (tuple(keys_shape[:-1]),
               (*keys_shape[:-2], query_length, keys_shape[-2]))
    if bias_shape is not None and tuple(bias_shape) not in allowed:
        raise RuntimeError(
            f"layer {layer_idx}: {name} returned a key bias of shape {tuple(bias_shape)}; it must"
            f" be (batch, kv_heads, keys) = {allowed[0]} or per query {allowed[1]}")
    own_mask = bias_shape is not None and len(bias_shape) == 4
    if query_length > 1 and not own_mask and mask_kv_length not in (None, keys_shape[-2]):
        raise RuntimeError(
            f"layer {layer_idx}: {keys_shape[-2]} keys for a {query_length}-token step, but the"
            f" causal mask was sized for {mask_kv_length}; a policy that drops tokens inside a"
            " multi-token step, or keeps a different count per layer, needs one-token decode"
            " steps")
