"""The temporal-decay layer cache: segments packed at the width their score gives, requantized
as they age, evicted when due (kvbench.methods.settings.decay)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

from kvbench.kernels.formats import KVSegment, PackedRead
from kvbench.methods.core.contracts import Codec, LayerCachePolicy, Packed, ReadPart
from kvbench.methods.core.newest import newest_dropped
from kvbench.methods.core.packed_reads import FusedReads, check_fresh
from kvbench.methods.core.read_parts import as_part, token_bytes
from kvbench.methods.settings.decay import Decay


@dataclass
class Segment:
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

    The schedule (score, bits_for, window, segment, evict_below) is the settings'
    (kvbench.methods.settings.decay.Decay); the codecs at each width come from `codecs`, on the
    arrays `ops` (kvbench.backends.arrays.Arrays): torch and MLX run this same logic."""

    def __init__(self, method: Decay, codecs: Callable[[int], tuple[Codec, Codec]], ops):
        self.ops = ops
        self.method = method
        self.codecs = codecs
        self.segments: list[Segment] = []
        self.raw_k = None
        self.raw_v = None
        self._seen = 0
        self.tokens_evicted = 0
        self.tokens_requantized = 0
        self._decoded = False
        self._fused: dict[int, FusedReads] = {}  # by width: the fused decode read of its codecs

    def keep_decoded(self) -> bool:
        """Every segment decoded once, when packed and again when requantized; offered when the
        codecs at every width are chunk separable (neighbouring segments at one width are decoded
        merged on the packed path)."""
        check_fresh(self, self.raw_k is None)
        self._decoded = all(codec.chunk_separable for bits in self.method.widths()
                            for codec in self.codecs(bits))
        return self._decoded

    def _keep(self, seg: Segment) -> None:
        if self._decoded:
            key_codec, value_codec = self.codecs(seg.bits)
            dtype, cast = self.raw_k.dtype, self.ops.cast
            seg.decoded_keys = cast(key_codec.decode(seg.keys), dtype)
            seg.decoded_values = cast(value_codec.decode(seg.values), dtype)

    @property
    def raw_tokens(self) -> int:
        return 0 if self.raw_k is None else self.raw_k.shape[-2]

    def append(self, keys, values, queries=None) -> None:
        self.raw_k = self.ops.extend(self.raw_k, keys)
        self.raw_v = self.ops.extend(self.raw_v, values)
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
            self.segments.append(Segment(
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
            keys = self.ops.joined([*(seg.decoded_keys for seg in self.segments), self.raw_k])
            values = self.ops.joined([*(seg.decoded_values for seg in self.segments), self.raw_v])
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
        keys = self.ops.joined([*keys, self.raw_k])
        return keys, self.ops.joined([*values, self.raw_v]), None

    def attention_segments(self, exact: tuple | None = None) -> PackedRead | None:
        """The segments as stored (neighbours at one width merged where the codec can) and the
        raw tokens, for a fused decode attention: where one kernel reads the codecs of every
        width held (and of base_bits, a fresh segment's), on the cached tensors' device."""
        if self._decoded or self.raw_k is None:
            return None
        found = self._fused_read(self.method.base_bits)
        if found is None:
            return None
        segments = []
        for bits, run in itertools.groupby(self.segments, key=lambda seg: seg.bits):
            width = self._fused_read(bits)
            if width is None or width[0] != found[0]:
                return None
            run = list(run)
            merged = [codec.merge([getattr(seg, side) for seg in run]) if len(run) > 1 else None
                      for codec, side in zip(self.codecs(bits), ("keys", "values"))]
            pairs = ([tuple(merged)] if None not in merged
                     else [(seg.keys, seg.values) for seg in run])
            segments += [KVSegment(keys.tensors, values.tensors, *width[1:])
                         for keys, values in pairs]
        segments.append(KVSegment(self.raw_k, self.raw_v))
        if exact is not None:
            segments = [*newest_dropped(segments, exact[0].shape[-2]), KVSegment(*exact)]
        return PackedRead(found[0], [segment for segment in segments if segment.tokens])

    def _fused_read(self, bits: int):
        """(kernel, key format, value format) of the fused read of the codecs at `bits`."""
        reads = self._fused.setdefault(bits, FusedReads(*self.codecs(bits)))
        return reads.find(self.raw_k.device, self.raw_k.shape[-1])

    def attention_parts(self, part_bytes: int) -> list[ReadPart] | None:
        """The segments (neighbours at one width merged, up to part_bytes decoded), each decoded
        when read, then the raw tokens: where they take more than part_bytes decoded."""
        per_token = token_bytes(self.ops, self.raw_k)
        if self.retained_tokens * per_token <= part_bytes:
            return None
        if self._decoded:
            parts = [as_part(seg.decoded_keys, seg.decoded_values) for seg in self.segments]
        else:
            runs: list[list[Segment]] = []
            for seg in self.segments:
                run = runs[-1] if runs else []
                if run and run[0].bits == seg.bits \
                        and (sum(s.tokens for s in run) + seg.tokens) * per_token <= part_bytes:
                    run.append(seg)
                else:
                    runs.append([seg])
            parts = [self._run_part(run) for run in runs]
        return [*parts, as_part(self.raw_k, self.raw_v)] if self.raw_tokens else parts

    def _run_part(self, run: list[Segment]) -> ReadPart:
        codecs, dtype = self.codecs(run[0].bits), self.raw_k.dtype

        def make():
            return tuple(self.ops.joined(self._decode(codec, [getattr(seg, side) for seg in run],
                                                      dtype))
                         for codec, side in zip(codecs, ("keys", "values")))
        return ReadPart(sum(seg.tokens for seg in run), make)

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
