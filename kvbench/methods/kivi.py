"""`kivi`: 2/4-bit keys per channel, values per token, the newest tokens in full precision."""
from __future__ import annotations

from typing import Any, ClassVar

from dataclasses import dataclass

from kvbench.methods.array_ops import TORCH_OPS
from kvbench.kernels import Impl
from kvbench.methods.base import (
    Codec, LayerCachePolicy, Method, Packed, register_method, run_as, start_impl,
)
from kvbench.methods.codec_cache import DecodedChunks, check_fresh
from kvbench.methods.intq import IntQCodec


class _Stream:
    """Keys or values of one layer: the oldest tokens packed by `codec` (merged into one block
    whenever the layout allows), the newer ones raw, in token order. On the decoded-once path
    (keep_decoded) `decoded` also holds every packed token, decoded as it was packed."""

    def __init__(self, codec: Codec, ops):
        self.codec, self.ops = codec, ops
        self.packed: list[Packed] = []
        self.packed_tokens = 0
        self.raw = None
        self.decoded: DecodedChunks | None = None

    def keep_decoded(self) -> None:
        self.decoded = DecodedChunks(self.ops)

    @property
    def raw_tokens(self) -> int:
        return 0 if self.raw is None else self.raw.shape[-2]

    def push(self, x) -> None:
        self.raw = x if self.raw is None else self.ops.concat([self.raw, x])

    def pack_oldest(self, tokens: int) -> None:
        if tokens <= 0:
            return
        # a copy, so the kept tail does not pin the storage of what was packed
        old, self.raw = self.raw[..., :tokens, :], self.ops.copy(self.raw[..., tokens:, :])
        self.packed.append(self.codec.encode(old))
        self.packed_tokens += tokens
        if self.decoded is not None:
            self.decoded.add(self.ops.cast(self.codec.decode(self.packed[-1]), old.dtype))
        merged = self.codec.merge(self.packed) if len(self.packed) > 1 else None
        if merged is not None:
            self.packed = [merged]

    def read(self):
        if self.decoded is not None:
            return self.decoded.read(self.raw)
        decoded = [self.ops.cast(self.codec.decode(p), self.raw.dtype) for p in self.packed]
        return self.ops.concat(decoded + [self.raw])

    def nbytes(self) -> int:
        return sum(self.codec.nbytes(p) for p in self.packed) + self.ops.nbytes(self.raw)

    def held(self) -> list:
        decoded = [] if self.decoded is None else self.decoded.chunks
        return [t for p in self.packed for t in p.tensors.values()] + [self.raw, *decoded]


class KiviCache(LayerCachePolicy):
    """One layer of KIVI. Each append first quantizes what earlier steps left by the rule (whole
    key chunks; values older than the newest `residual`), then adds the new tokens raw, so
    attention reads the current step's keys and values in full precision, as upstream does.
    Array operations go through `ops` (kvbench.methods.array_ops)."""

    ops = TORCH_OPS

    def __init__(self, key_codec: Codec, value_codec: Codec, residual: int, group_size: int):
        self.keys = _Stream(key_codec, self.ops)
        self.values = _Stream(value_codec, self.ops)
        self.key_chunk = residual or group_size
        self.residual = residual

    def append(self, keys, values, queries=None) -> None:
        self._quantize()
        self.keys.push(keys)
        self.values.push(values)

    def keep_decoded(self) -> bool:
        """The decoded-once path, for keys and values both or neither (KIVI's codecs are intq,
        chunk separable)."""
        check_fresh(self, self.keys.raw is None)
        if not (self.keys.codec.chunk_separable and self.values.codec.chunk_separable):
            return False
        self.keys.keep_decoded()
        self.values.keep_decoded()
        return True

    def end_prefill(self) -> None:
        self._quantize()

    def _quantize(self) -> None:
        raw_keys = self.keys.raw_tokens
        self.keys.pack_oldest(raw_keys - raw_keys % self.key_chunk)
        self.values.pack_oldest(self.values.raw_tokens - self.residual)

    def attention_inputs(self):
        return self.keys.read(), self.values.read(), None

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        return self.keys.packed_tokens + self.keys.raw_tokens

    @property
    def retained_bytes(self) -> int:
        return self.keys.nbytes() + self.values.nbytes()

    def measured_bytes(self) -> int:
        return self.ops.held_bytes(*self.keys.held(), *self.values.held())


@register_method("kivi")
@dataclass
class Kivi(Method):
    """KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache").

    Scheme: asymmetric min/max quantization (IntQCodec): scale = (max - min) / (2^bits - 1) and
    min stored in float16, q = round((x - min) / scale) packed at `bits` bits. Keys are grouped per
    channel over `group_size` consecutive tokens, values per token over `group_size` channels.
    Bits per quantized value: bits + 32 / group_size (3.0 at bits=2, group_size=32), when
    head_dim is a multiple of group_size (a trailing partial group of channels has its own scale).

    Residual, as the upstream code (jy-yuan/KIVI, models/llama_kivi.py) does it: after a step has
    attended, raw keys are quantized in whole chunks of `residual` tokens (so T mod residual stay
    raw after T tokens) and values once they are older than the newest `residual` tokens (so
    min(T, residual) stay raw). The step's own tokens, and the chunk they complete, are attended in
    full precision and quantized at the next append (or end_prefill); the prefill attends to
    itself unquantized. Between steps, KIVI holds quantized + raw = every token seen. residual=0
    (not allowed upstream) quantizes keys in whole groups of `group_size` and every value.

    Parameters:
        bits: int = 2 — 2 or 4, for keys and values both.
        group_size: int = 32 — values per quantization group (>= 1).
        residual: int = 128 — newest tokens kept in full precision; a multiple of group_size
            (>= 0). Raw tokens count at the model's dtype.
        impl: "auto" | "torch" | "triton" = "auto" — who encodes and decodes: the torch
            reference, or the Triton kernels (the same bytes; kvbench.kernels); auto: the
            kernels on CUDA where triton is installed. Kernels need a power-of-two group_size
            of at least 8 / bits.
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).

    codec() is None: keys and values use different codecs, given by key_codec() and value_codec().

    Defaults: METHODS.md §KIVI (bits=2, group_size=32, residual=128); upstream jy-yuan/KIVI has no
    single default: utils/process_args.py ModelArguments (k_bits=v_bits=2, group_size=128,
    residual_length=128), example.py (k_bits=v_bits=2, group_size=32, residual_length=32).
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({"group_size": 8, "residual": 16}, {})

    bits: int = 2
    group_size: int = 32
    residual: int = 128
    impl: Impl = "auto"

    def __post_init__(self):
        if self.bits not in (2, 4):
            raise ValueError(f"bits must be 2 or 4, got {self.bits!r}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size!r}")
        if self.residual < 0 or self.residual % self.group_size:
            raise ValueError(
                f"residual must be a multiple of group_size ({self.group_size}) and >= 0,"
                f" got {self.residual!r}"
            )
        start_impl(self)

    def key_codec(self) -> IntQCodec:
        return run_as(self, IntQCodec(self.bits, self.group_size, "channel"))

    def value_codec(self) -> IntQCodec:
        return run_as(self, IntQCodec(self.bits, self.group_size, "token"))

    def layout(self) -> str:
        return (
            f"keys: {self.key_codec().layout()}, quantized in chunks of {self.residual} tokens; "
            f"values: {self.value_codec().layout()}, once older than the newest {self.residual}; "
            "the rest full precision; K and V both counted"
        )

    def new_layer_cache(self, layer_idx: int) -> KiviCache:
        return KiviCache(self.key_codec(), self.value_codec(), self.residual, self.group_size)
