"""The two method contracts every backend implements (Codec, LayerCachePolicy), and the
implementation a method's settings become on a backend. Array-library free: arrays are torch
tensors or mx.arrays, and the few operations a cache performs on them go through the array
seam it is handed (kvbench.backends.arrays).

Tensor layout everywhere: keys/values are (batch, kv_heads, tokens, head_dim), as transformers
and mlx-lm hold them.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from kvbench.kernels import ImplLog

if TYPE_CHECKING:
    from kvbench.backends.arrays import Arrays
    from kvbench.kernels.formats import PackedRead


@dataclass
class Packed:
    """A codec's stored form: every array in `tensors` is a stored byte that counts."""

    tensors: dict[str, Any]
    shape: tuple[int, ...]
    dtype: Any
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class ReadPart:
    """`tokens` tokens of a layer's read in parts (LayerCachePolicy.attention_parts), made
    (keys, values) by make() when attention reaches them."""

    tokens: int
    make: Callable[[], tuple[Any, Any]]

    def head(self, n: int) -> ReadPart:
        """Its first n tokens (kvbench.methods.core.newest: the step read as given after them)."""
        return ReadPart(n, lambda: tuple(x[..., :n, :] for x in self.make()))


class LayoutFormat(Protocol):
    """A stored layout that a codec holds as its `format` (kvbench.kernels.formats.IntQFormat):
    what Codec's defaults read from it."""

    @property
    def token_block(self) -> int: ...

    def merge_axis(self, shapes: list[tuple[int, ...]]) -> int | None: ...

    def stacking_axis(self, ndim: int) -> int | None: ...

    def describe(self) -> str: ...


class Codec(ABC):
    """Turns (..., tokens, head_dim) arrays into fewer bytes and back.

    A codec built from a format (Codec(fmt), a LayoutFormat) takes its token_block, merge,
    stacking_axis and layout from it, on any backend: merge joins the parts with the codec's
    `arrays` (kvbench.backends.arrays), which each backend's codecs name."""

    # The library of the arrays it stores (torch's or MLX's).
    arrays: Arrays | None = None
    format: LayoutFormat | None = None
    # decode(merge(parts)) equals, bit for bit, the concatenation of decode(part) whatever the
    # parts' sizes: true only where every decoded element comes from its own stored values by
    # elementwise operations (unpacking, lookups, multiplies, adds), never from a product or a
    # reduction whose kernel, and so whose rounding, may depend on how many rows are decoded at
    # once. What lets a cache decode each chunk once (LayerCachePolicy.keep_decoded). By the same
    # token, encode of arrays joined along the batch gives each row the bytes its own encode
    # gives: what lets a batched step pack every sequence's tokens in one call
    # (kvbench.methods.core.codec_cache.append_rows).
    chunk_separable: bool = False

    def __init__(self, fmt: LayoutFormat | None = None):
        self.format = fmt

    @property
    def token_block(self) -> int:
        """Tokens a codec must see at once (per-channel quantization groups over tokens)."""
        return 1 if self.format is None else self.format.token_block

    @abstractmethod
    def encode(self, x) -> Packed: ...

    @abstractmethod
    def decode(self, packed: Packed): ...

    def nbytes(self, packed: Packed) -> int:
        """Every stored byte: indices, scales, zero points, norms."""
        return sum(t.nbytes for t in packed.tensors.values())

    def merge(self, parts: list[Packed]) -> Packed | None:
        """One Packed equal to `parts` concatenated along tokens, or None if the layout cannot.
        Lets a cache hold one block instead of a chunk per decode step (decode cost per step)."""
        axis = None if self.format is None else self.format.merge_axis([p.shape for p in parts])
        return None if axis is None else concat_packed(parts, axis, self.arrays.concat)

    def stacking_axis(self, packed: Packed) -> int | None:
        """The axis (from the front) along which every stored array of `packed` holds one entry
        per token, so that tokens can be written after the last in place (Room); None where
        the layout does not stack tokens."""
        return None if self.format is None else self.format.stacking_axis(len(packed.shape))

    def layout(self) -> str:
        """What a ratio built on this codec's bytes is made of."""
        return type(self).__name__ if self.format is None else self.format.describe()

    def kernel_unsupported(self) -> str | None:
        """Why this configuration has no kernel; None when it has one (then a torch codec's
        kernel_format describes its layout to the kernels, kvbench.methods.torch.base)."""
        return f"{type(self).__name__} has no kernel"


def concat_packed(parts: list[Packed], axis: int, concat: Any) -> Packed:
    """`parts` joined along tokens: every stored array concatenated along `axis` by `concat`
    (torch.cat or mx.concatenate)."""
    tensors = {name: concat([p.tensors[name] for p in parts], axis) for name in parts[0].tensors}
    tokens = sum(p.shape[-2] for p in parts)
    return Packed(tensors, (*parts[0].shape[:-2], tokens, parts[0].shape[-1]), parts[0].dtype)


def codecs_layout(keys: Codec, values: Codec) -> str:
    """One codec's layout when keys and values share it, else both, named."""
    if keys.layout() == values.layout():
        return keys.layout()
    return f"keys: {keys.layout()}; values: {values.layout()}"


class LayerCachePolicy(ABC):
    """Decides what one layer keeps; its attention_inputs() is what attention reads."""

    # Sparse-V: at one-token steps, value rows whose softmax weight is below this are skipped
    # (0 = off). A policy that sets it implements record_sparse_v.
    value_skip_threshold: float = 0.0
    # A policy that scores tokens by attention sets this; the model's attention then calls
    # observe_queries() after every forward of this layer.
    observes_queries: bool = False

    @abstractmethod
    def append(self, keys, values, queries=None) -> None:
        """Take the step's keys and values. They may be kept as they are, never written into:
        a shared prefill hands every method the same arrays (kvbench.models.shared_prefill)."""

    @abstractmethod
    def attention_inputs(self) -> tuple[Any, Any, Any]:
        """(keys, values, additive bias per cached key or None) for the next queries."""

    def begin_prompt(self, tokens: int) -> None:
        """The prompt about to be fed has `tokens` tokens: told before its first forward by
        kvbench.models.session.prefill, which every benchmark and the server prefill through (a
        policy that evicts while prefilling sizes a ratio budget from it). Default: nothing."""

    def reserve(self, tokens: int) -> None:
        """The sequence will hold at most `tokens` tokens (the server's prompt + max_tokens): a
        policy may hold room for them so that appending does not copy what it holds. Default:
        nothing."""

    def take_prompt(self, keys, values, key_buffer, value_buffer) -> bool:
        """append() of a whole prompt recorded elsewhere (kvbench.models.shared_prefill) into a
        policy that holds nothing yet, handed over: `keys` and `values` are the first tokens of
        these buffers, which are the policy's now, to hold and to write after those tokens (the
        room a reservation asked for). Returns whether it took the prompt; the default takes
        nothing (False): the host then appends it."""
        return False

    def end_prefill(self) -> None:
        """Called once after the prompt is in; compaction methods compress here."""

    def after_read(self) -> None:
        """The step just appended was read (or ingested): drop what no later query reads (a
        sliding window's tokens older than it, kvbench.methods.core.window_cache). Default:
        nothing."""

    def observe_queries(self, queries) -> None:
        """The post-RoPE queries (batch, query_heads, q, head_dim) of the step that just attended
        over attention_inputs(); query head h reads KV head h // (query_heads // kv_heads).
        Called only when observes_queries is set."""
        raise NotImplementedError(f"{type(self).__name__} sets observes_queries"
                                  " but does not take them")

    @property
    def summary_slots(self) -> int:
        """Keys attention_inputs() returns that stand for groups of tokens (block summaries)
        rather than tokens; they come first. The rest are retained_tokens tokens."""
        return 0

    @property
    @abstractmethod
    def seen_tokens(self) -> int:
        """Tokens appended so far; new tokens take positions from here."""

    @property
    @abstractmethod
    def retained_tokens(self) -> int: ...

    @property
    @abstractmethod
    def retained_bytes(self) -> int:
        """Accounted bytes: what the layout stores, keys and values both."""

    @abstractmethod
    def measured_bytes(self) -> int:
        """Bytes of the arrays this object actually holds right now."""

    def trim(self, n: int) -> int:
        """Forget the newest n tokens (a rewind: speculative decoding, retries), as far as the
        policy can; returns how many it dropped. Default: none (what was compressed stays)."""
        return 0

    def holds_exactly(self, newest: int) -> bool:
        """attention_inputs() returns its `newest` newest tokens as they were appended (full
        precision), so a read of them as the model made them (prefill_reads "exact") needs no
        replacement. Default: not known, so they are replaced."""
        return False

    def attention_inputs_exact(self, keys, values) -> tuple[Any, Any, Any] | None:
        """attention_inputs() with its newest tokens, the `keys` and `values` just appended,
        read as given: for a policy that builds that in one pass. Default None: the host
        replaces them in what attention_inputs() returned (one more copy)."""
        return None

    def keep_decoded(self) -> bool:
        """Switch to the decoded-once read path, if this policy has one, and say whether it did.
        Call it before the first append. A policy that stores keys or values packed and decodes
        them in attention_inputs() may instead decode each packed chunk once, when it is packed,
        and keep the decoded arrays for attention: attention_inputs() then returns exactly what it
        would have (bit for bit, at every step), retained_bytes still counts the packed layout,
        and measured_bytes() counts the decoded copy too. Default: no such path (False)."""
        return False

    def attention_segments(self, exact: tuple | None = None) -> PackedRead | None:
        """What a fused decode attention reads instead of attention_inputs(): the layer's keys
        and values as it stores them (kvbench.kernels.formats.PackedRead: packed chunks and raw
        tokens in order, and the kernel that reads them), or None when it has no such path for
        its current tensors. Asked at one-token steps only; the segments must hold exactly
        attention_inputs()' tokens. `exact`: the step's (keys, values), to be read as given in
        place of their stored form (as attention_inputs_exact). Default: none."""
        return None

    def attention_parts(self, part_bytes: int) -> list[ReadPart] | None:
        """attention_inputs()' keys and values (no bias) as parts in token order
        (ReadPart: its tokens, and a function that makes its
        keys and values when attention reaches it), each of about `part_bytes` where it makes
        them: what a read takes where joining them, or decoding them all at once, would take
        more than `part_bytes` (kvbench.models.part_attention merges the parts' softmaxes).
        None where one read serves (the default): attention_inputs() then."""
        return None

    def record_sparse_v(self, rows_skipped: int, rows: int, output_error: float) -> None:
        """Told by the attention after each sparse-V step (output_error: mean relative squared
        error of the attention output against the dense sum)."""
        raise NotImplementedError(f"{type(self).__name__} sets value_skip_threshold"
                                  " but does not record what was skipped")

    def counters(self) -> dict[str, float]:
        """Running totals this policy wants reported (summed over layers by the cache), e.g.
        value rows skipped or tokens evicted."""
        return {}


class Backend(Protocol):
    """Where an implementation runs, as kvbench.methods.implementation hands it over: the array
    library's name and arrays (kvbench.backends.arrays), and how to build another method's
    implementation there (a wrapper's base)."""

    name: str
    arrays: Any

    def implement(self, settings: Any) -> "Implementation": ...


C = TypeVar("C", bound=Codec)


class Implementation(ABC):
    """A method as one backend runs it, built from its settings (kvbench.methods.settings) and
    the backend: what benchmarks, models and the server call. Backends register one per
    settings class (kvbench.methods.settings.base.implements); kvbench.methods.implementation
    builds it."""

    impl_log: ImplLog | None = None  # which implementation ran, where the settings choose (impl)

    def __init__(self, settings: Any, on: Backend):
        self.settings = settings
        self.on = on
        if hasattr(settings, "impl"):
            self.impl_log = ImplLog()

    def run_as(self, codec: C) -> C:
        """`codec` set to run as the settings' impl, noting into this method's log."""
        codec.impl, codec.impl_log = self.settings.impl, self.impl_log
        return codec

    @property
    def name(self) -> str:
        return type(self.settings).name or type(self.settings).__name__

    def supports(self):
        """This configuration's capabilities (kvbench.methods.settings.base.Capabilities)."""
        return self.settings.supports()

    @property
    def prefill_reads(self) -> str:
        """"exact" or "stored" (kvbench.methods.settings.base.MethodSettings.prefill_reads)."""
        return self.settings.prefill_reads

    @property
    def shares_prefill(self) -> bool:
        """Its prefill forward is the plain model's, bit for bit: its policies keep every token
        until end_prefill, read the prompt's keys and values as the model made them, and add no
        bias. A prompt prefilled once (kvbench.models.shared_prefill) may then be handed to its
        cache. kvbench.testing.check_method verifies the claim on the tiny model."""
        return False

    @property
    def shares_chunked_prefill(self) -> bool:
        """shares_prefill also when the prompt is fed in several forwards: its policies hold
        every token exactly until end_prefill, so a later chunk attends over the earlier ones as
        the plain model's would (a codec that encodes as the prompt comes does not)."""
        return self.shares_prefill

    @property
    def prompt_queries(self) -> int | None:
        """How many of the prompt's newest queries its policies read before end_prefill: 0
        none, n the newest n (snapkv's window), None every one (h2o's scores). A shared
        prefill records only these."""
        return 0

    def reference_probe(self, prompt: list[int]) -> list[int]:
        return self.settings.reference_probe(prompt)

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        """Methods that set themselves from a calibration pass override this. Benchmarks call it
        once per case, before any cache is built, with statistics of tokens that are not the
        ones they score, measured on the case's model (kvbench.models.session.CalibrationStats):
        a method works on arrays, never on a model."""

    @abstractmethod
    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        """A fresh policy for one layer of one sequence."""

    def codec(self) -> Codec | None:
        """The codec behind this method, if it has one (the proofs benchmark needs it)."""
        return None

    @property
    def stores_reads(self) -> bool:
        """Its policies store exactly the keys, values and bias attention reads (nothing packs
        them), so their accounted bytes are those of the read: by default, when it has no
        codec. kvbench.testing.check_method holds it to that."""
        return self.key_codec() is None

    def key_codec(self) -> Codec | None:
        """The codec for keys; methods that treat keys and values differently override both."""
        return self.codec()

    def value_codec(self) -> Codec | None:
        return self.codec()

    def layout(self) -> str:
        """What every ratio this method reports is made of: its codecs, its full-precision
        sinks and window (`sinks` and `window` settings, where it has them), and that keys and
        values both count; a method without codecs says it in its settings' layout()."""
        keys, values = self.key_codec(), self.value_codec()
        if keys is None or values is None:
            own = getattr(self.settings, "layout", None)
            return own() if own else f"{type(self.settings).__name__}, K and V both counted"
        parts = [codecs_layout(keys, values)]
        sinks = getattr(self.settings, "sinks", None)
        if sinks:
            parts.append(f"first {sinks} tokens full precision")
        window = getattr(self.settings, "window", 0)
        if window:
            parts.append(f"newest {window} tokens full precision")
        return "; ".join([*parts, "K and V both counted"])


class SharesExactPrefill(Implementation):
    """A method whose prefill forward, in one forward under exact reads, is the plain model's
    (kivi, decay, adaptive): it reads the forward's own tokens as the model made them. Not in
    several: its policies pack tokens as they come (beyond kivi's residual, decay's window),
    so a later forward reads the earlier ones packed."""

    @property
    def shares_prefill(self) -> bool:
        return self.prefill_reads == "exact"

    @property
    def shares_chunked_prefill(self) -> bool:
        return False
