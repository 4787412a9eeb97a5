"""KIVI's layer cache: keys quantized per channel in whole chunks, values per token once older
than the residual, the newest tokens in full precision (kvbench.methods.settings.kivi)."""
from __future__ import annotations

from abc import abstractmethod

from kvbench.kernels.formats import KernelFormat, KVSegment, PackedRead, is_channel, token_axis
from kvbench.methods.core.contracts import (
    Codec, LayerCachePolicy, Packed, ReadPart, SharesExactPrefill)
from kvbench.methods.core.newest import newest_dropped
from kvbench.methods.core.packed_reads import DecodedChunks, FusedReads, check_fresh
from kvbench.methods.core.read_parts import token_bytes, tokens_per_part
from kvbench.methods.core.window_cache import KiviWindow, cut_step, token_range


class Stream:
    """Keys or values of one layer: the oldest tokens packed by `codec` (merged into one block
    whenever the layout allows), the newer ones raw, in token order. On the decoded-once path
    (keep_decoded) `decoded` also holds every packed token, decoded as it was packed."""

    def __init__(self, codec: Codec, ops):
        self.codec, self.ops = codec, ops
        self.packed: list[Packed] = []
        self.packed_tokens = 0
        self.raw = None
        self.decoded: DecodedChunks | None = None
        # the first packed tokens, older than a sliding window, not read (a per-channel group
        # that still holds tokens in the window: kvbench.methods.core.window_cache)
        self.hidden = 0

    def keep_decoded(self) -> None:
        self.decoded = DecodedChunks(self.ops)

    @property
    def raw_tokens(self) -> int:
        return 0 if self.raw is None else self.raw.shape[-2]

    def push(self, x) -> None:
        self.raw = self.ops.extend(self.raw, x)

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

    @property
    def read_packed(self) -> int:
        """Packed tokens that are read (all but the hidden ones)."""
        return self.packed_tokens - self.hidden

    def read(self):
        if self.decoded is not None:
            return self.decoded.read(self.raw)
        decoded = [self.ops.cast(self.codec.decode(p), self.raw.dtype) for p in self.packed]
        out = self.ops.joined(decoded + [self.raw])
        return out[..., self.hidden:, :] if self.hidden else out

    def nbytes(self) -> int:
        return sum(self.codec.nbytes(p) for p in self.packed) + self.ops.nbytes(self.raw)

    def span(self, start: int, end: int, fmt: KernelFormat):
        """Tokens [start, end) as a fused read takes them from one side of a segment: a raw
        tensor, or the packed tensors that begin at `start` (views). A per-channel block read
        from a token inside a group is decoded there instead (at most a chunk's worth). Tokens
        are counted from the first one read (after the hidden ones)."""
        start, end = start + self.hidden, end + self.hidden
        if start >= self.packed_tokens:
            first = start - self.packed_tokens
            return self.raw[..., first : first + end - start, :]
        (packed,) = self.packed
        if not is_channel(fmt):
            return {name: t.narrow(token_axis(fmt, name), start, end - start)
                    for name, t in packed.tensors.items()}
        group = fmt.group_size
        first_group = start // group
        tensors = {name: t[..., fmt.stored_tokens(name, first_group * group):]
                   for name, t in packed.tensors.items()}
        if start % group == 0:
            return tensors
        tokens = self.packed_tokens - first_group * group
        window = Packed(tensors, (*packed.shape[:-2], tokens, packed.shape[-1]), packed.dtype)
        decoded = self.ops.cast(self.codec.decode(window), self.raw.dtype)
        return decoded[..., start % group : start % group + end - start, :]

    def part(self, start: int, stop: int):
        """Tokens [start, stop) at the raw dtype (no hidden ones): packed ones as kept decoded,
        or decoded from the whole groups around them (cut_step); raw ones as views."""
        out = []
        if start < self.packed_tokens:
            end = min(stop, self.packed_tokens)
            out += self._kept(start, end) if self.decoded is not None else [
                self._decode(start, end)]
        if stop > self.packed_tokens:
            first = max(start - self.packed_tokens, 0)
            out.append(self.raw[..., first : stop - self.packed_tokens, :])
        return out[0] if len(out) == 1 else self.ops.joined(out)

    def _kept(self, start: int, end: int) -> list:
        out, at = [], 0
        for chunk in self.decoded.chunks:
            tokens = chunk.shape[-2]
            if at < end and at + tokens > start:
                out.append(chunk[..., max(start - at, 0) : min(end - at, tokens), :])
            at += tokens
        return out

    def _decode(self, start: int, end: int):
        (packed,) = self.packed
        step = cut_step(self.codec, packed)
        low, high = ((start - start % step, min(-(-end // step) * step, self.packed_tokens))
                     if step else (0, self.packed_tokens))
        window = token_range(self.codec, packed, low, high)
        return self.ops.cast(self.codec.decode(window), self.raw.dtype)[
            ..., start - low : end - low, :]

    def held(self) -> list:
        decoded = [] if self.decoded is None else self.decoded.chunks
        return [t for p in self.packed for t in p.tensors.values()] + [self.raw, *decoded]


class KiviCache(LayerCachePolicy):
    """One layer of KIVI. Each append first quantizes what earlier steps left by the rule (whole
    key chunks; values older than the newest `residual`), then adds the new tokens raw, so
    attention reads the current step's keys and values in full precision, as upstream does.
    `ops`: the arrays it holds (kvbench.backends.arrays.Arrays)."""

    def __init__(self, key_codec: Codec, value_codec: Codec, residual: int, group_size: int,
                 ops):
        self.ops = ops
        self.keys = Stream(key_codec, self.ops)
        self.values = Stream(value_codec, self.ops)
        self.key_chunk = residual or group_size
        self.residual = residual
        self.fused = FusedReads(key_codec, value_codec)

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

    def holds_exactly(self, newest: int) -> bool:
        return min(self.keys.raw_tokens, self.values.raw_tokens) >= newest

    def attention_inputs(self):
        return self.keys.read(), self.values.read(), None

    def attention_parts(self, part_bytes: int) -> list[ReadPart] | None:
        """Parts of about part_bytes (decoded when attention reaches them, or as kept decoded),
        cut where either side turns from packed to raw and between whole key groups; None
        where the read is small, with hidden tokens (a sliding window's) or packed blocks that
        did not merge."""
        keys, values = self.keys, self.values
        per_token = token_bytes(self.ops, keys.raw)
        if self.retained_tokens * per_token <= part_bytes or keys.hidden or values.hidden:
            return None
        if keys.decoded is None and (len(keys.packed) > 1 or len(values.packed) > 1):
            return None
        size = tokens_per_part(part_bytes, per_token, self.key_chunk)
        cuts = sorted({*range(0, self.retained_tokens, size), keys.packed_tokens,
                       values.packed_tokens, self.retained_tokens})
        return [ReadPart(end - start, lambda start=start, end=end: (
            keys.part(start, end), values.part(start, end)))
            for start, end in zip(cuts, cuts[1:])]

    def attention_segments(self, exact: tuple | None = None) -> PackedRead | None:
        """The tokens cut where either side changes from packed to raw, each segment's sides
        as Stream.span takes them, for a fused decode attention (both codecs' kernel: the CPU
        one reads keys per channel); None on the decoded-once path or while a side holds
        packed parts that did not merge."""
        keys, values = self.keys, self.values
        if keys.decoded is not None or keys.raw is None \
                or len(keys.packed) > 1 or len(values.packed) > 1:
            return None
        found = self.fused.find(keys.raw.device, keys.raw.shape[-1])
        if found is None:
            return None
        kernel, key_fmt, value_fmt = found
        cuts = sorted({0, keys.read_packed, values.read_packed, self.retained_tokens})
        segments = []
        for start, end in zip(cuts, cuts[1:]):
            key_side = keys.span(start, end, key_fmt)
            value_side = values.span(start, end, value_fmt)
            segments.append(KVSegment(
                key_side, value_side, key_fmt if isinstance(key_side, dict) else None,
                value_fmt if isinstance(value_side, dict) else None, length=end - start))
        if exact is not None:
            segments = [*newest_dropped(segments, exact[0].shape[-2]), KVSegment(*exact)]
        return PackedRead(kernel, [segment for segment in segments if segment.tokens])

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        return self.keys.read_packed + self.keys.raw_tokens

    @property
    def retained_bytes(self) -> int:
        return self.keys.nbytes() + self.values.nbytes()

    def measured_bytes(self) -> int:
        return self.ops.held_bytes(*self.keys.held(), *self.values.held())


class WindowedKiviCache(KiviWindow, KiviCache):
    """KIVI's cache of a sliding-window layer (kvbench.methods.core.window_cache)."""


class KiviMethod(SharesExactPrefill):
    """KIVI on any backend: its key (per channel) and value (per token) intq codecs come from the
    backend's implementation; the cache and the layout are the same everywhere."""

    @abstractmethod
    def key_codec(self) -> Codec: ...

    @abstractmethod
    def value_codec(self) -> Codec: ...

    def layout(self) -> str:
        residual = self.settings.residual
        return (f"keys: {self.key_codec().layout()}, quantized in chunks of {residual} tokens; "
                f"values: {self.value_codec().layout()}, once older than the newest {residual}; "
                "the rest full precision; K and V both counted")

    def new_layer_cache(self, layer_idx: int) -> KiviCache:
        s = self.settings
        return KiviCache(self.key_codec(), self.value_codec(), s.residual, s.group_size,
                         self.on.arrays)

    def new_window_cache(self, layer_idx: int, window: int) -> KiviCache:
        s = self.settings
        return WindowedKiviCache(self.key_codec(), self.value_codec(), s.residual,
                                 s.group_size, self.on.arrays, window)
