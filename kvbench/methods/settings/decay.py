"""`decay`: temporal decay over any method with a `bits` field: older segments of the cache are
requantized to fewer bits, then evicted."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, above, at_least, between, param, span
from kvbench.methods.settings.base import MethodSettings, register_method
from kvbench.methods.settings.wrapped import (
    MAX_BITS, BitWidths, bit_variants, nearest_width, refused,
)


@register_method("decay")
@dataclass
class Decay(BitWidths, MethodSettings):
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
    Reads: a one-token step, where the base's codecs have a fused decode attention on the
    cache's device (the CPU's numba kernel, Triton), reads the segments as stored, every width in
    one call; else they are decoded, neighbours at one width together.
    Counters (summed over layers): tokens_evicted; tokens_requantized (each re-encoding counts:
    a token taken 4 -> 3 -> 2 bits counts twice).

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

    implemented_in: ClassVar[dict[str, str]] = {
        "torch": "kvbench.methods.core.wrappers",
        "mlx": "kvbench.methods.core.wrappers",
    }
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"base_params": {"block": 16}, "window": 8, "segment": 8},
        {"base": "intq", "base_params": {"group_size": 16}, "base_bits": 4, "window": 8,
         "segment": 8})

    base: str = param("turbo", meaning="the method whose codecs store the segments; it needs an"
                      " integer `bits` field. Its cache policy (its own window, KIVI's residual)"
                      " is not used")
    base_params: dict[str, Any] = param(
        factory=dict, meaning="the base's parameters, without bits (and without a nonzero"
        " window: set this method's own; without sinks)")
    base_bits: int = param(3, range=span(1, MAX_BITS), meaning="the width of a fresh segment"
                           " (score 1); the base must accept it")
    min_bits: int = param(2, range=span(1, MAX_BITS), rule="<= base_bits",
                          meaning="the floor; the base must accept it")
    decay_rate: float = param(1.0, range=above(0),
                              meaning="lambda, upstream's default decay_lambda")
    window: int = param(128, range=at_least(0), meaning="newest tokens kept in full precision")
    segment: int = param(64, range=at_least(1), rule="a multiple of the base codecs' token_block",
                         meaning="tokens packed, requantized and evicted together (e.g. a"
                         " multiple of KIVI's group_size)")
    min_below: float = param(0.3, range=between(0, 1), meaning="scores below it get min_bits")
    evict_below: float = param(0.1, range=at_least(0), rule="<= min_below",
                               meaning="scores below it are evicted (0 turns eviction off)")

    def check(self) -> None:
        if self.min_bits > self.base_bits:
            raise SettingError("min_bits", f"min_bits must be <= base_bits ({self.base_bits}),"
                                           f" got {self.min_bits!r}")
        if not math.isfinite(self.decay_rate):
            raise SettingError("decay_rate", f"decay_rate must be a finite number > 0, got"
                                             f" {self.decay_rate!r}")
        if not self.evict_below <= self.min_below:
            raise SettingError("evict_below", f"evict_below must be in [0, min_below"
                                              f" ({self.min_below})], got {self.evict_below!r}")
        variants = bit_variants(self.base, self.base_params,
                                range(self.min_bits, self.base_bits + 1))
        for name in ("base_bits", "min_bits"):
            if getattr(self, name) not in variants:
                raise refused(name, getattr(self, name), self.base, variants, self.base_params)
        if self.base_params.get("window"):
            raise SettingError("base_params", "base_params: window is the base cache's full-"
                               "precision window, which decay does not use; set decay's own"
                               " window")
        if self.base_params.get("sinks"):
            raise SettingError("base_params", "base_params: sinks are the base cache's full-"
                               "precision first tokens, which decay does not use")
        for variant in variants.values():
            block = variant.token_block()
            if block is None:
                raise SettingError("base", f"base: method {self.base!r} has no codec to store"
                                           " segments with")
            if self.segment % block:
                raise SettingError("segment", f"segment must be a multiple of {block} (tokens"
                                              f" the {self.base!r} codec packs at once), got"
                                              f" {self.segment}")
        self.variants = variants

    def policy_beyond_codec(self) -> list[str]:
        parts = [f"segments requantized from {self.base_bits} to {self.min_bits} bits as they age"]
        if self.evict_below:
            parts.append(f"segments evicted below score {self.evict_below:g}")
        if self.window:
            parts.append(f"newest {self.window} tokens full precision (window)")
        return parts

    # The schedule, for the cache and for anyone checking it.

    def score(self, age: int, seen: int) -> float:
        """exp(-decay_rate * age / (seen - 1)); 1 while one token has been seen."""
        return 1.0 if seen <= 1 else math.exp(-self.decay_rate * age / (seen - 1))

    def bits_for(self, score: float) -> int:
        """The width for a score (whether it is evicted is `score < evict_below`)."""
        if score < self.min_below:
            return self.min_bits
        target = self.min_bits + (self.base_bits - self.min_bits) * score
        return nearest_width(target, self.widths(), tie_toward=self.base_bits)
