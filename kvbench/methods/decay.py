"""`decay`: temporal decay over any method with a `bits` field: older segments of the cache are
requantized to fewer bits, then evicted."""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from kvbench.methods.array_ops import TORCH_OPS
from kvbench.methods.base import (
    Codec,
    LayerCachePolicy,
    Method,
    Packed,
    codecs_layout,
    register_method,
)
from kvbench.methods.codec_cache import check_fresh
from kvbench.methods.widths import bit_variants, check_width, nearest_width, refused


@dataclass
class _Segment:
    """`tokens` consecutive tokens from absolute index `start`, packed at `bits`."""

    start: int
    tokens: int
    bits: int
    keys: Packed
    values: Packed
    # the decoded-once path: keys and values decoded when packed (or requantized), raw dtype
    decoded_keys: Any = None
    decoded_values: Any = None

    @property
    def newest(self) -> int:
        return self.start + self.tokens - 1


class DecayCache(LayerCachePolicy):
    """One layer under temporal decay. Tokens arrive raw; once `segment` of them lie beyond the
    newest `window`, the oldest `segment` are packed as one segment at the width their score gives.
    After every append each segment's score is taken again: a segment whose width fell is decoded
    and re-encoded at the new width (never upward); one whose score fell below `evict_below` is
    dropped, but only at a one-token append or at end_prefill (see `Decay`).

    The schedule (score, bits_for, window, segment, evict_below) is `method`'s; the codecs at each
    width come from `codecs` (default: method.codecs). Array operations go through `ops`
    (kvbench.methods.array_ops); kvbench.methods.mlx.decay runs this same logic on mx.array with
    the MLX ops and codecs."""

    ops = TORCH_OPS

    def __init__(self, method: Decay,
                 codecs: Callable[[int], tuple[Codec, Codec]] | None = None):
        self.method = method
        self.codecs = codecs or method.codecs
        self.segments: list[_Segment] = []
        self.raw_k = None
        self.raw_v = None
        self._seen = 0
        self.tokens_evicted = 0
        self.tokens_requantized = 0
        self._decoded = False

    def keep_decoded(self) -> bool:
        """Every segment decoded once, when packed and again when requantized; offered when the
        codecs at every width are chunk separable (neighbouring segments at one width are decoded
        merged on the packed path)."""
        check_fresh(self, self.raw_k is None)
        self._decoded = all(codec.chunk_separable for bits in self.method.widths()
                            for codec in self.codecs(bits))
        return self._decoded

    def _keep(self, seg: _Segment) -> None:
        if self._decoded:
            key_codec, value_codec = self.codecs(seg.bits)
            dtype, cast = self.raw_k.dtype, self.ops.cast
            seg.decoded_keys = cast(key_codec.decode(seg.keys), dtype)
            seg.decoded_values = cast(value_codec.decode(seg.values), dtype)

    @property
    def raw_tokens(self) -> int:
        return 0 if self.raw_k is None else self.raw_k.shape[-2]

    def append(self, keys, values, queries=None) -> None:
        if self.raw_k is None:
            self.raw_k, self.raw_v = keys, values
        else:
            self.raw_k = self.ops.concat([self.raw_k, keys])
            self.raw_v = self.ops.concat([self.raw_v, values])
        self._seen += keys.shape[-2]
        self._pack()
        # A multi-token step attends through a causal mask sized before it, to every key kept:
        # eviction there would return fewer keys than the mask expects. It waits for a one-token
        # step or end_prefill; requantization keeps the count and runs at every append.
        self._decay(evict=keys.shape[-2] == 1)

    def end_prefill(self) -> None:
        self._decay(evict=True)

    def _pack(self) -> None:
        m = self.method
        spill = self.raw_tokens - m.window
        spill -= spill % m.segment
        if spill <= 0:
            return
        first = self._seen - self.raw_tokens  # absolute index of the oldest raw token
        for offset in range(0, spill, m.segment):
            start = first + offset
            bits = m.bits_for(m.score(self._seen - 1 - (start + m.segment - 1), self._seen))
            key_codec, value_codec = self.codecs(bits)
            part = slice(offset, offset + m.segment)
            self.segments.append(_Segment(
                start, m.segment, bits,
                key_codec.encode(self.raw_k[..., part, :]),
                value_codec.encode(self.raw_v[..., part, :]),
            ))
            self._keep(self.segments[-1])
        # a copy, so the kept tail does not pin the storage of what was packed
        self.raw_k = self.ops.copy(self.raw_k[..., spill:, :])
        self.raw_v = self.ops.copy(self.raw_v[..., spill:, :])

    def _decay(self, evict: bool) -> None:
        m = self.method
        kept = []
        for seg in self.segments:
            score = m.score(self._seen - 1 - seg.newest, self._seen)
            if evict and score < m.evict_below:
                self.tokens_evicted += seg.tokens
                continue
            bits = m.bits_for(score)
            if bits < seg.bits:
                old_keys, old_values = self.codecs(seg.bits)
                new_keys, new_values = self.codecs(bits)
                seg.keys = new_keys.encode(old_keys.decode(seg.keys))
                seg.values = new_values.encode(old_values.decode(seg.values))
                seg.bits = bits
                self.tokens_requantized += seg.tokens
                self._keep(seg)
            kept.append(seg)
        self.segments = kept

    def attention_inputs(self):
        if self._decoded:
            keys = self.ops.concat([*(seg.decoded_keys for seg in self.segments), self.raw_k])
            values = self.ops.concat([*(seg.decoded_values for seg in self.segments), self.raw_v])
            return keys, values, None
        keys, values = [], []
        dtype = self.raw_k.dtype
        # Neighbouring segments at one width are decoded in one call where the codec can merge
        # them (a temporary: the cache keeps holding the segments themselves).
        for bits, run in itertools.groupby(self.segments, key=lambda seg: seg.bits):
            run = list(run)
            key_codec, value_codec = self.codecs(bits)
            keys.extend(self._decode(key_codec, [seg.keys for seg in run], dtype))
            values.extend(self._decode(value_codec, [seg.values for seg in run], dtype))
        keys = self.ops.concat([*keys, self.raw_k])
        return keys, self.ops.concat([*values, self.raw_v]), None

    def _decode(self, codec: Codec, parts: list[Packed], dtype) -> list:
        merged = codec.merge(parts) if len(parts) > 1 else None
        return [self.ops.cast(codec.decode(p), dtype)
                for p in ([merged] if merged is not None else parts)]

    @property
    def seen_tokens(self) -> int:
        return self._seen

    @property
    def retained_tokens(self) -> int:
        return sum(seg.tokens for seg in self.segments) + self.raw_tokens

    @property
    def retained_bytes(self) -> int:
        packed = 0
        for seg in self.segments:
            key_codec, value_codec = self.codecs(seg.bits)
            packed += key_codec.nbytes(seg.keys) + value_codec.nbytes(seg.values)
        return packed + self.ops.nbytes(self.raw_k, self.raw_v)

    def measured_bytes(self) -> int:
        held = [t for seg in self.segments
                for t in (*seg.keys.tensors.values(), *seg.values.tensors.values(),
                          seg.decoded_keys, seg.decoded_values)]
        return self.ops.held_bytes(*held, self.raw_k, self.raw_v)

    def segment_bits(self) -> list[int]:
        """The width of each segment held, oldest first."""
        return [seg.bits for seg in self.segments]

    def counters(self) -> dict[str, float]:
        # tokens_requantized counts each re-encoding: a token taken 4 -> 3 -> 2 bits counts twice.
        return {"tokens_evicted": float(self.tokens_evicted),
                "tokens_requantized": float(self.tokens_requantized)}


@register_method("decay")
@dataclass
class Decay(Method):
    """Temporal decay: older cached tokens are requantized to fewer bits, the oldest evicted.

    Source: TurboQuant+'s temporal-decay extension as its MLX port (ediestel/turboquant-plus-mlx,
    turboquant/temporal_decay.py) schedules it: with T tokens seen, a token of age a (tokens
    appended after it) scores s = exp(-decay_rate * a / (T - 1)), 1 for the newest and
    exp(-decay_rate) for the oldest; its width is min_bits + (base_bits - min_bits) * s, min_bits
    below s = `min_below` (0.3), and it is evicted below s = `evict_below` (0.1). Upstream's cache
    applies the schedule as one mean width per head; here every segment has its own width.

    Scheme: wraps any registered method with an integer `bits` field (intq, lloydmax, turbo,
    kivi, ...) and uses its key and value codecs, built with base_params at each width between
    min_bits and base_bits that the base accepts. The newest `window` tokens stay raw (full
    precision, counted at their dtype), and so do up to segment - 1 older ones until a whole
    segment of `segment` tokens lies beyond the window: those are packed together, at the width
    their score gives. A segment's age is that of its newest token, so it is evicted only when
    every token in it is due. After every append each segment is scored again; one whose width
    fell is decoded and re-encoded at the new width (requantization, never upward).
    Width rule: the width the base accepts nearest to min_bits + (base_bits - min_bits) * s, a
    tie going to the wider one; min_bits when s < min_below.
    Eviction timing: the transformers adapter sizes a multi-token step's causal mask before the
    step, to the keys kept then plus the new ones, so a policy must not drop keys inside such a
    step. Eviction therefore happens at one-token appends and at end_prefill(); after a
    multi-token append (the prefill, or a decode chunk) due segments wait, requantized to
    min_bits, for the next of those. Requantization keeps the token count and runs at every
    append. Seen tokens count evicted ones too, so positions continue.
    With the upstream decay_rate 1.0 the oldest token scores exp(-1) = 0.37: no token drops
    below 0.3 or 0.1, so nothing is evicted or forced to min_bits; eviction starts at
    decay_rate > ln 10 = 2.30 (the oldest 1 - ln 10 / decay_rate of the tokens).
    Counters (summed over layers): tokens_evicted; tokens_requantized (each re-encoding counts:
    a token taken 4 -> 3 -> 2 bits counts twice).

    Parameters:
        base: str = "turbo" — the method whose codecs store the segments; it needs an integer
            `bits` field. Its cache policy (its own window, KIVI's residual) is not used.
        base_params: dict = {} — the base's parameters, without bits (and without a nonzero
            window: set this method's own).
        base_bits: int = 3 — the width of a fresh segment (score 1); the base must accept it.
        min_bits: int = 2 — the floor (1..base_bits); the base must accept it.
        decay_rate: float = 1.0 — lambda (> 0), upstream's default decay_lambda.
        window: int = 128 — newest tokens kept in full precision (>= 0).
        segment: int = 64 — tokens packed, requantized and evicted together (>= 1; a multiple of
            the base codecs' token_block, e.g. KIVI's group_size).
        min_below: float = 0.3 — scores below it get min_bits.
        evict_below: float = 0.1 — scores below it are evicted (0 <= evict_below <= min_below
            <= 1; 0 turns eviction off).
    Tensors: keys and values (batch, kv_heads, tokens, head_dim).
    In a suite: `{name: decay, params: {base: turbo, base_params: {block: 64}, base_bits: 4,
    min_bits: 2, decay_rate: 4.0, window: 128, segment: 64}}`.

    key_codec() and value_codec() are the base's at base_bits: what a fresh segment is stored
    with (the proofs benchmark measures that codec, not the decay).

    Defaults: upstream ediestel/turboquant-plus-mlx turboquant/temporal_decay.py DecayConfig
    (decay_lambda=1.0, min_bits=2.0, reduction_threshold=0.3, eviction_threshold=0.1); differ:
    its base_bits=3.5 (3 here: integer widths), mode=BIT_REDUCTION (never evicts) and
    window_size=None (when set it evicts all older tokens); window and segment are kvbench's.
    """

    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"base_params": {"block": 16}, "window": 8, "segment": 8},
        {"base": "intq", "base_params": {"group_size": 16}, "base_bits": 4, "window": 8,
         "segment": 8})

    base: str = "turbo"
    base_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    base_bits: int = 3
    min_bits: int = 2
    decay_rate: float = 1.0
    window: int = 128
    segment: int = 64
    min_below: float = 0.3
    evict_below: float = 0.1

    def __post_init__(self):
        check_width("base_bits", self.base_bits)
        check_width("min_bits", self.min_bits)
        if self.min_bits > self.base_bits:
            raise ValueError(f"min_bits must be <= base_bits ({self.base_bits}),"
                             f" got {self.min_bits!r}")
        if not (isinstance(self.decay_rate, (int, float)) and math.isfinite(self.decay_rate)
                and self.decay_rate > 0):
            raise ValueError(f"decay_rate must be a finite number > 0, got {self.decay_rate!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be an int >= 0, got {self.window!r}")
        if isinstance(self.segment, bool) or not isinstance(self.segment, int) or self.segment < 1:
            raise ValueError(f"segment must be an int >= 1, got {self.segment!r}")
        if not 0 <= self.min_below <= 1:
            raise ValueError(f"min_below must be in [0, 1], got {self.min_below!r}")
        if not 0 <= self.evict_below <= self.min_below:
            raise ValueError(f"evict_below must be in [0, min_below ({self.min_below})],"
                             f" got {self.evict_below!r}")
        variants = bit_variants(self.base, self.base_params,
                                range(self.min_bits, self.base_bits + 1))
        for name in ("base_bits", "min_bits"):
            if getattr(self, name) not in variants:
                raise refused(name, getattr(self, name), self.base, variants, self.base_params)
        if self.base_params.get("window"):
            raise ValueError("base_params: window is the base cache's full-precision window,"
                             " which decay does not use; set decay's own window")
        self._widths = sorted(variants)
        self._variants = variants
        self._codecs: dict[int, tuple[Codec, Codec]] = {}
        for bits, variant in variants.items():
            keys, values = variant.key_codec(), variant.value_codec()
            if keys is None or values is None:
                raise ValueError(f"base: method {self.base!r} has no codec to store segments with")
            for codec in (keys, values):
                if self.segment % codec.token_block:
                    raise ValueError(f"segment must be a multiple of {codec.token_block} (tokens"
                                     f" the {self.base!r} codec packs at once), got {self.segment}")
            self._codecs[bits] = (keys, values)

    # The schedule, for the cache and for anyone checking it.

    def score(self, age: int, seen: int) -> float:
        """exp(-decay_rate * age / (seen - 1)); 1 while one token has been seen."""
        return 1.0 if seen <= 1 else math.exp(-self.decay_rate * age / (seen - 1))

    def bits_for(self, score: float) -> int:
        """The width for a score (whether it is evicted is `score < evict_below`)."""
        if score < self.min_below:
            return self.min_bits
        target = self.min_bits + (self.base_bits - self.min_bits) * score
        return nearest_width(target, self._widths, tie_toward=self.base_bits)

    def codecs(self, bits: int) -> tuple[Codec, Codec]:
        return self._codecs[bits]

    def variant(self, bits: int) -> Method:
        """The base method built with base_params at `bits` (one of widths())."""
        return self._variants[bits]

    def widths(self) -> list[int]:
        """The widths used: those the base accepts between min_bits and base_bits."""
        return list(self._widths)

    def key_codec(self) -> Codec:
        return self._codecs[self.base_bits][0]

    def value_codec(self) -> Codec:
        return self._codecs[self.base_bits][1]

    def new_layer_cache(self, layer_idx: int) -> DecayCache:
        return DecayCache(self)

    def layout(self) -> str:
        widths = ", ".join(str(b) for b in self._widths)
        return (
            f"decay over {self.base}: segments of {self.segment} tokens start at "
            f"{self.base_bits} bits ({codecs_layout(*self._codecs[self.base_bits])}) and are "
            f"requantized down to {self.min_bits} bits (widths {widths}) as "
            f"exp(-{self.decay_rate:g} * age / (T - 1)) falls, {self.min_bits} bits below "
            f"{self.min_below:g}, evicted below {self.evict_below:g}; newest {self.window} tokens "
            f"(and up to {self.segment - 1} more awaiting a whole segment) full precision; "
            "K and V both counted"
        )
