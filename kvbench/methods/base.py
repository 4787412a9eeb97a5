"""The two method contracts (Codec, LayerCachePolicy), the Method config base and its registry.

Tensor layout everywhere: keys/values are (batch, kv_heads, tokens, head_dim), as transformers
and mlx-lm hold them.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from kvbench.kernels import ImplLog, check_impl, use_triton
from kvbench.kernels.formats import KernelFormat
from kvbench.registry import Registry


@dataclass
class Packed:
    """A codec's stored form: every tensor in `tensors` is a stored byte that counts."""

    tensors: dict[str, torch.Tensor]
    shape: tuple[int, ...]
    dtype: torch.dtype
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


class Codec(ABC):
    """Turns (..., tokens, head_dim) tensors into fewer bytes and back."""

    # Tokens a codec must see at once (per-channel quantization groups over tokens).
    token_block: int = 1
    # decode(merge(parts)) equals, bit for bit, the concatenation of decode(part) whatever the
    # parts' sizes: true only where every decoded element comes from its own stored values by
    # elementwise operations (unpacking, lookups, multiplies, adds), never from a product or a
    # reduction whose kernel, and so whose rounding, may depend on how many rows are decoded at
    # once. What lets a cache decode each chunk once (LayerCachePolicy.keep_decoded).
    chunk_separable: bool = False
    # Which implementation encodes and decodes (kvbench.kernels): "auto" | "torch" | "triton";
    # a method with kernels sets it from its `impl` field and hands over its log of what ran.
    impl: str = "torch"
    impl_log: ImplLog | None = None

    @abstractmethod
    def encode(self, x: torch.Tensor) -> Packed: ...

    @abstractmethod
    def decode(self, packed: Packed) -> torch.Tensor: ...

    def nbytes(self, packed: Packed) -> int:
        """Every stored byte: indices, scales, zero points, norms."""
        return sum(t.numel() * t.element_size() for t in packed.tensors.values())

    def merge(self, parts: list[Packed]) -> Packed | None:
        """One Packed equal to `parts` concatenated along tokens, or None if the layout cannot.
        Lets a cache hold one block instead of a chunk per decode step (decode cost per step)."""
        return None

    def layout(self) -> str:
        """What a ratio built on this codec's bytes is made of."""
        return type(self).__name__

    def kernel_unsupported(self) -> str | None:
        """Why this configuration has no Triton kernel; None when it has one (then
        kernel_format describes its layout to the kernels)."""
        return f"{type(self).__name__} has no kernel"

    def kernel_format(self, dim: int) -> KernelFormat:
        """The layout of vectors of `dim` values, as kvbench.kernels.triton reads and writes it."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel")

    def kernel_for(self, device: torch.device, dim: int) -> KernelFormat | None:
        """The kernel format to run for tensors on `device`, or None for the torch reference,
        as self.impl chooses (kvbench.kernels.use_triton)."""
        if self.impl == "torch":
            return None
        reason = self.kernel_unsupported()
        fmt = None
        if not reason:
            # one format per dim: it keeps its tables on the device for every later call
            formats = self.__dict__.setdefault("_kernel_formats", {})
            fmt = formats.get(dim) or formats.setdefault(dim, self.kernel_format(dim))
            reason = fmt.unsupported()
        return fmt if use_triton(self.impl, device, reason) else None

    def kernel_encode(self, x: torch.Tensor) -> Packed | None:
        """x packed by the kernel, when kernel_for picks it; else None (the caller runs the
        reference). Notes which ran in impl_log."""
        fmt = self.kernel_for(x.device, x.shape[-1])
        self._note("encode", fmt)
        if fmt is None:
            return None
        from kvbench.kernels import triton as kernels

        return Packed(kernels.encode(x, fmt), tuple(x.shape), x.dtype)

    def kernel_decode(self, packed: Packed) -> torch.Tensor | None:
        """The decoded tensor by the kernel, when kernel_for picks it; else None."""
        device = next(iter(packed.tensors.values())).device
        fmt = self.kernel_for(device, packed.shape[-1])
        self._note("decode", fmt)
        if fmt is None:
            return None
        from kvbench.kernels import triton as kernels

        return kernels.decode(packed.tensors, fmt, packed.shape, packed.dtype)

    def _note(self, operation: str, fmt: KernelFormat | None) -> None:
        if self.impl_log is not None:
            self.impl_log.note(operation, "torch" if fmt is None else "triton")


C = TypeVar("C", bound=Codec)


class LayerCachePolicy(ABC):
    """Decides what one layer keeps; its attention_inputs() is what attention reads."""

    # Sparse-V: at one-token steps, value rows whose softmax weight is below this are skipped
    # (0 = off). A policy that sets it implements record_sparse_v.
    value_skip_threshold: float = 0.0
    # A policy that scores tokens by attention sets this; the model's attention then calls
    # observe_queries() after every forward of this layer.
    observes_queries: bool = False

    @abstractmethod
    def append(
        self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None
    ) -> None: ...

    @abstractmethod
    def attention_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(keys, values, additive bias per cached key or None) for the next queries."""

    def end_prefill(self) -> None:
        """Called once after the prompt is in; compaction methods compress here."""

    def observe_queries(self, queries: torch.Tensor) -> None:
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
        """Bytes of the tensors this object actually holds right now."""

    def trim(self, n: int) -> int:
        """Forget the newest n tokens (a rewind: speculative decoding, retries), as far as the
        policy can; returns how many it dropped. Default: none (what was compressed stays)."""
        return 0

    def keep_decoded(self) -> bool:
        """Switch to the decoded-once read path, if this policy has one, and say whether it did.
        Call it before the first append. A policy that stores keys or values packed and decodes
        them in attention_inputs() may instead decode each packed chunk once, when it is packed,
        and keep the decoded arrays for attention: attention_inputs() then returns exactly what it
        would have (bit for bit, at every step), retained_bytes still counts the packed layout,
        and measured_bytes() counts the decoded copy too. Default: no such path (False)."""
        return False

    def attention_segments(self) -> list | None:
        """What a fused decode attention reads instead of attention_inputs(): the layer's keys
        and values as it stores them (kvbench.kernels.formats.KVSegment, packed chunks and raw
        tokens in order), or None when it has no such path for its current tensors.
        Asked at one-token steps only; the segments must hold exactly attention_inputs()'
        tokens. Default: none."""
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


class WrappedPolicy(LayerCachePolicy):
    """Stores exactly what `inner` stores and forwards every call to it; a subclass changes only
    how attention reads it (sparse-V) or what arrays cross over (MLX bridging)."""

    def __init__(self, inner: LayerCachePolicy):
        self.inner = inner

    @property
    def observes_queries(self) -> bool:
        return self.inner.observes_queries

    def append(self, keys, values, queries=None) -> None:
        self.inner.append(keys, values, queries)

    def attention_inputs(self):
        return self.inner.attention_inputs()

    def observe_queries(self, queries) -> None:
        self.inner.observe_queries(queries)

    def end_prefill(self) -> None:
        self.inner.end_prefill()

    def trim(self, n: int) -> int:
        return self.inner.trim(n)

    def keep_decoded(self) -> bool:
        return self.inner.keep_decoded()

    @property
    def summary_slots(self) -> int:
        return self.inner.summary_slots

    @property
    def seen_tokens(self) -> int:
        return self.inner.seen_tokens

    @property
    def retained_tokens(self) -> int:
        return self.inner.retained_tokens

    @property
    def retained_bytes(self) -> int:
        return self.inner.retained_bytes

    def measured_bytes(self) -> int:
        return self.inner.measured_bytes()

    def counters(self) -> dict[str, float]:
        return self.inner.counters()


class HasCodecs:
    """The codecs of a method (torch Method, or its MLX implementation)."""

    def codec(self) -> Codec | None:
        """The codec behind this method, if it has one (the proofs benchmark needs it)."""
        return None

    def key_codec(self) -> Codec | None:
        """The codec for keys; methods that treat keys and values differently override both."""
        return self.codec()

    def value_codec(self) -> Codec | None:
        return self.codec()


DEVICE_TYPES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class Capabilities:
    """What a method's caches support. A suite that asks for anything else is refused when it
    is validated; kvbench.testing.check_method checks each declared one for real. MLX support is
    not declared here: it is an implementation registered for the exact class
    (kvbench.methods.mlx.base.mlx_implementation)."""

    decode_chunk: bool = True  # decode steps of several tokens (perplexity's decode_chunk > 1)
    trim: bool = False  # takes back any of its newest tokens before end_prefill (parity's trim,
    # a probe fed and taken back)
    probes: bool = False  # reads the queries of a probe fed and taken back before end_prefill
    devices: tuple[str, ...] = DEVICE_TYPES  # torch device types its tensors may live on

    def lacks(self, wanted: str) -> bool:
        if wanted in DEVICE_TYPES:
            return wanted not in self.devices
        return not getattr(self, wanted)


@dataclass
class Method(HasCodecs, ABC):
    """Base of every method. Subclasses are dataclasses: the fields are the configuration,
    ranges are checked in __post_init__ (raise ValueError naming the field).

    `capabilities` says what its caches support; `conformance_params` are the settings
    kvbench.testing.check_method runs it with (by default once, with its defaults)."""

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def supports(self) -> Capabilities:
        """This configuration's capabilities (a wrapper's are its base's)."""
        return self.capabilities

    @abstractmethod
    def new_layer_cache(self, layer_idx: int) -> LayerCachePolicy:
        """A fresh policy for one layer of one sequence."""

    def calibrate(self, stats: Any, tokens: list[int]) -> None:
        """Methods that set themselves from a calibration pass override this. Benchmarks call it
        once per case, before any cache is built, with statistics of tokens that are not the
        ones they score, measured on the case's model (kvbench.models.session.CalibrationStats):
        a method works on tensors, never on a model."""

    def reference_probe(self, prompt: list[int]) -> list[int]:
        """Tokens a benchmark feeds after the prompt and takes back before end_prefill, so the
        policies can read their queries (e.g. the prompt again: repeat-prefill queries). None by
        default."""
        return []

    def layout(self) -> str:
        """What every ratio this method reports is made of: its codecs, its full-precision
        window (a `window` field, where it has one), and that keys and values both count."""
        keys, values = self.key_codec(), self.value_codec()
        if keys is None or values is None:
            return f"{type(self).__name__}, K and V both counted"
        parts = [codecs_layout(keys, values)]
        window = getattr(self, "window", 0)
        if window:
            parts.append(f"newest {window} tokens full precision")
        return "; ".join([*parts, "K and V both counted"])

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def codecs_layout(keys: Codec, values: Codec) -> str:
    """One codec's layout when keys and values share it, else both, named."""
    if keys.layout() == values.layout():
        return keys.layout()
    return f"keys: {keys.layout()}; values: {values.layout()}"


def start_impl(method: Method) -> None:
    """From the __post_init__ of a method with an `impl` field (kvbench.kernels): start its log
    of what ran, and refuse an impl that cannot run its codecs, before anything runs."""
    method.impl_log = ImplLog()
    for codec in (method.key_codec(), method.value_codec()):
        check_impl(method.impl, codec.kernel_unsupported())


def run_as(method: Method, codec: C) -> C:
    """`codec` set to run as `method.impl`, noting into the method's log (start_impl)."""
    codec.impl, codec.impl_log = method.impl, method.impl_log
    return codec


METHODS: Registry[Method] = Registry("method", entry_point_group="kvbench.methods")
register_method = METHODS.register


def build_method(name: str, params: dict[str, Any] | None = None) -> Method:
    """A registered method from its name and parameters, checked as strictly as a suite's
    methods entry ("4" for an int is refused; methods that wrap another method build it with
    this). An unknown name or a bad parameter is a ValueError, so a wrapper's __post_init__
    refuses it like any other bad setting."""
    from kvbench.params import build_strict

    try:
        cls = METHODS.get(name)
    except LookupError as exc:
        raise ValueError(str(exc)) from None
    return build_strict(cls, params or {})


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def storage_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the distinct storages behind `tensors`: what is really held, views included."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
