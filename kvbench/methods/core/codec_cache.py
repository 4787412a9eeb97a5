"""A codec as a layer cache policy: packed storage, decoded on read (the reference path), or, once
keep_decoded() has switched it, decoded once as each chunk is packed (the decoded-once path)."""
from __future__ import annotations

import functools

from kvbench.kernels.formats import KernelFormat, KVSegment, PackedRead
from kvbench.methods.core.contracts import Codec, Implementation, LayerCachePolicy, Packed, \
    ReadPart
from kvbench.methods.core.newest import newest_dropped, newest_replaced
from kvbench.methods.core.packed_reads import DecodedChunks, FusedReads, check_fresh
from kvbench.methods.core.read_parts import as_part, decoded_parts, token_bytes, tokens_per_part
from kvbench.methods.core.room import Room
from kvbench.methods.core.tail import ROOM_TOKENS, Tail, offered
from kvbench.methods.core.window_cache import CodecWindow

# A window this wide keeps every token raw: the cache never packs (identity's "auto").
UNBOUNDED_WINDOW = 1 << 62


class CodecCache(LayerCachePolicy):
    """Stores keys and values packed by `codec`; the first `sinks` tokens (attention sinks), the
    newest `window` tokens (and any tokens that do not yet fill a whole `codec.token_block`) stay
    in full precision, as appended, and count at their dtype. Attention reads the sinks, the
    packed tokens decoded, then the raw tail, in token order.

    Decoded-once path (keep_decoded(), before the first append): each chunk is also decoded when
    it is packed, cast to the raw dtype and kept, so attention_inputs() only concatenates. Offered
    when both codecs are chunk_separable (then it hands attention exactly the packed path's
    arrays, merges included) and the cache can pack at all. Accounted bytes stay the packed ones;
    measured_bytes() counts the decoded copy too.

    `in_place` (the default): a raw tail that never packs (identity) is a Tail buffer written
    in place; and from the first pack shorter than ROOM_TOKENS (a decode step) the packed block
    is kept in a Room with space for ROOM_TOKENS more tokens (never past what reserve() said it
    will hold), where the codecs stack tokens and the arrays can be written in place: a step
    writes after the filled tokens instead of joining them with its own (measured_bytes()
    counts the room). Not in place: both are joined at every step, as transformers'
    DynamicCache does (identity's `storage: concat`, the baseline of old).

    `ops`: its arrays' library (kvbench.backends.arrays.Arrays), torch's or MLX's alike."""

    def __init__(self, key_codec: Codec, value_codec: Codec, window: int, ops, sinks: int = 0,
                 in_place: bool = True):
        self.ops, self.in_place = ops, in_place
        self.key_codec, self.value_codec = key_codec, value_codec
        self.window = window
        self.sinks = sinks
        self._sink_k = None  # the first tokens, never packed (None: no token there yet)
        self._sink_v = None
        self._block = max(key_codec.token_block, value_codec.token_block)
        self._packed: list[tuple[Packed, Packed]] = []
        self._packed_tokens = 0
        self._reserved = 0
        self._rooms: tuple[Room, Room] | None = None
        # a buffer only where the tail never spills: a window's few tokens are cheap to join
        buffered = in_place and window >= UNBOUNDED_WINDOW
        self._tails = (Tail(ops, buffered), Tail(ops, buffered))
        # On the decoded-once path: every packed token, decoded and cast to the raw dtype.
        self._decoded: tuple[DecodedChunks, DecodedChunks] | None = None
        self._fused = FusedReads(key_codec, value_codec)

    def keep_decoded(self) -> bool:
        check_fresh(self, self._raw_k is None)
        if self.window >= UNBOUNDED_WINDOW:
            return False  # never packs: attention already reads what it stores
        if not (self.key_codec.chunk_separable and self.value_codec.chunk_separable):
            # decoding chunk by chunk could round differently from decoding the merged block
            return False
        self._decoded = (DecodedChunks(self.ops), DecodedChunks(self.ops))
        return True

    def append(self, keys, values, queries=None) -> None:
        spilled = self._extend(keys, values)
        if spilled is not None:
            k_old, v_old = spilled
            self._store(self.key_codec.encode(k_old), self.value_codec.encode(v_old),
                        k_old.shape[-2])

    def take_prompt(self, keys, values, key_buffer, value_buffer) -> bool:
        if self.sinks:  # the tail's first tokens are not the buffer's
            return False
        with offered(self._tails, (key_buffer, value_buffer)):
            self.append(keys, values)
        return True

    def _extend(self, keys, values) -> tuple | None:
        """Append raw; the (keys, values) that leave the window now, to be packed, or None."""
        if self._sink_tokens < self.sinks:
            keys, values = self._fill_sinks(keys, values)
        for tail, x in zip(self._tails, (keys, values)):
            tail.extend(x, self._reserved - self._sink_tokens - self._packed_tokens)
        spill = self._tails[0].tokens - self.window
        spill -= spill % self._block
        if spill <= 0:
            return None
        return tuple(tail.take_front(spill) for tail in self._tails)

    @property
    def _raw_k(self):
        return self._tails[0].array

    @property
    def _raw_v(self):
        return self._tails[1].array

    def _fill_sinks(self, keys, values) -> tuple:
        """Keep the first tokens the sinks still lack; the rest, copied (a view pins the step)."""
        take = self.sinks - self._sink_tokens
        parts = []
        for held, x in ((self._sink_k, keys), (self._sink_v, values)):
            head = self.ops.copy(x[..., :take, :])
            parts.append((head if held is None else self.ops.concat([held, head]),
                          self.ops.copy(x[..., take:, :])))
        (self._sink_k, keys), (self._sink_v, values) = parts
        return keys, values

    @property
    def _sink_tokens(self) -> int:
        return 0 if self._sink_k is None else self._sink_k.shape[-2]

    def reserve(self, tokens: int) -> None:
        self._reserved = tokens

    def _store(self, pk: Packed, pv: Packed, tokens: int, views: bool = False) -> None:
        """Keep a packed chunk; `views` of a larger encode are copied unless merged (a copy)."""
        self._packed_tokens += tokens
        if self._decoded is not None:
            self._keep(pk, pv)
        if self._rooms is not None and self._rooms[0].fits(tokens):
            for room, packed in zip(self._rooms, (pk, pv)):
                room.write(packed, self.ops)
            return
        self._packed = [*self._blocks(), (pk, pv)]
        self._rooms = None
        self._merge_packed()
        # rooms serve steps, and reservations: a room of all it will hold spares each later
        # chunk a merge (a copy of the layer, in pieces of growing size the allocator kept)
        if len(self._packed) == 1 and self.in_place and (tokens < ROOM_TOKENS
                                                         or self._reservation_ahead()):
            self._rooms = self._make_rooms(*self._packed[0])
            if self._rooms is not None:
                self._packed = []
                return
        if views and self._packed[-1][0] is pk:
            self._packed[-1] = (self._copied(pk), self._copied(pv))

    def _blocks(self) -> list[tuple[Packed, Packed]]:
        """The packed chunks in token order: the rooms' filled part, where there are rooms."""
        if self._rooms is not None:
            return [(self._rooms[0].filled(), self._rooms[1].filled())]
        return self._packed

    def step_rooms(self) -> tuple[Room, Room] | None:
        """The rooms a one-token step's packed token goes straight into (batch_lane writes it,
        then calls stepped()): when the cache packs every token as it comes (window 0, blocks of
        one token, no decoded copies) and they have space; never with sinks (read alone)."""
        if self.window or self.sinks or self._block != 1 or self._decoded is not None \
                or self._rooms is None or not self._rooms[0].fits(1) or self._raw_k is None \
                or self._tails[0].tokens:
            return None
        return self._rooms

    def stepped(self) -> None:
        """One token was written after the filled ones of each of step_rooms()."""
        self._packed_tokens += 1
        for room in self._rooms:
            room.wrote(1)

    def _make_rooms(self, pk: Packed, pv: Packed) -> tuple[Room, Room] | None:
        """Rooms holding the packed block with space for what a reservation still ahead will
        bring, else for ROOM_TOKENS more; None where a codec does not stack tokens or the arrays
        are not written in place."""
        axes = self.key_codec.stacking_axis(pk), self.value_codec.stacking_axis(pv)
        if None in axes:
            return None
        capacity = (self._reserved - self._sink_tokens if self._reservation_ahead()
                    else self._packed_tokens + ROOM_TOKENS)
        rooms = tuple(Room.around(packed, axis, capacity, self.ops)
                      for packed, axis in zip((pk, pv), axes))
        return None if None in rooms else rooms

    def _reservation_ahead(self) -> bool:
        return self._reserved > self._sink_tokens + self._packed_tokens

    def _copied(self, packed: Packed) -> Packed:
        tensors = {name: self.ops.copy(t) for name, t in packed.tensors.items()}
        return Packed(tensors, packed.shape, packed.dtype, packed.meta)

    def _keep(self, pk: Packed, pv: Packed) -> None:
        """Decode a chunk just packed, as attention_inputs() of the packed path would."""
        dtype, cast = self._raw_k.dtype, self.ops.cast
        keys, values = self._decoded
        keys.add(cast(self.key_codec.decode(pk), dtype))
        values.add(cast(self.value_codec.decode(pv), dtype))

    def _merge_packed(self) -> None:
        # one packed block: the fused attention reads it in one call per side (each chunk apart
        # would cost a kernel launch per chunk per step)
        if len(self._packed) < 2:
            return
        keys = self.key_codec.merge([pk for pk, _ in self._packed])
        values = self.value_codec.merge([pv for _, pv in self._packed])
        if keys is not None and values is not None:
            self._packed = [(keys, values)]

    def trim(self, n: int) -> int:
        """Only full-precision tokens can be taken back; packed ones stay (and so do the sinks
        once any token after them is packed)."""
        dropped = min(n, self._tails[0].tokens)
        if dropped:
            for tail in self._tails:
                tail.trim(dropped)
        if dropped < n and self._sink_tokens and not self._packed_tokens:
            # nothing packed: the sinks are the newest tokens
            keep = max(0, self._sink_tokens - (n - dropped))
            dropped += self._sink_tokens - keep
            self._sink_k, self._sink_v = self._sink_k[..., :keep, :], self._sink_v[..., :keep, :]
        return dropped

    def holds_exactly(self, newest: int) -> bool:
        if self._raw_k is None:
            return False
        exact = self._tails[0].tokens + (0 if self._packed_tokens else self._sink_tokens)
        return exact >= newest

    def attention_inputs(self):
        keys, values = self._read_parts()
        return self.ops.joined(keys), self.ops.joined(values), None

    def attention_inputs_exact(self, keys, values):
        if keys.shape[-2] == self.retained_tokens:  # the step is all it holds: nothing to decode
            return keys, values, None
        stored_keys, stored_values = self._read_parts()
        return (self.ops.joined(newest_replaced(stored_keys, keys)),
                self.ops.joined(newest_replaced(stored_values, values)), None)

    def _read_parts(self) -> tuple[list, list]:
        """Keys and values attention reads, as parts in token order: the sinks, the packed
        chunks decoded (or kept decoded) at the raw dtype, then the raw tail."""
        if self._decoded is not None:
            keys, values = (decoded.chunks for decoded in self._decoded)
        else:
            dtype, cast = self._raw_k.dtype, self.ops.cast
            blocks = self._blocks()
            keys = [cast(self.key_codec.decode(pk), dtype) for pk, _ in blocks]
            values = [cast(self.value_codec.decode(pv), dtype) for _, pv in blocks]
        sink_k, sink_v = ([self._sink_k], [self._sink_v]) if self._sink_tokens else ([], [])
        return [*sink_k, *keys, self._raw_k], [*sink_v, *values, self._raw_v]

    def attention_parts(self, part_bytes: int) -> list[ReadPart] | None:
        """Sinks, packed tokens (kept decoded, or decoded a part at a time), raw tail: where
        they take more than part_bytes decoded."""
        raw, per_token = self._raw_k, token_bytes(self.ops, self._raw_k)
        if self.retained_tokens * per_token <= part_bytes:
            return None
        if self._decoded is not None:
            packed = list(map(as_part, self._decoded[0].chunks, self._decoded[1].chunks))
        else:
            size = tokens_per_part(part_bytes, per_token, self._block)
            packed = [part for pk, pv in self._blocks() for part in decoded_parts(
                self.key_codec, self.value_codec, pk, pv, raw.dtype, self.ops, size)]
        sinks = [as_part(self._sink_k, self._sink_v)] if self._sink_tokens else []
        tail = [as_part(raw, self._raw_v)] if self._tails[0].tokens else []
        return [*sinks, *packed, *tail]

    def attention_segments(self, exact: tuple | None = None) -> PackedRead | None:
        """The packed chunks and the raw tail for a fused decode attention, when both codecs
        have one that reads their layouts on the cached tensors' device (a torch codec's
        attention_kernel, kvbench.methods.torch.base.TorchCodec); noted as the "decode
        attention" each time it is asked. `exact`: the step's keys and values, read as given in
        place of their stored form (exact reads, when the step was packed as it came)."""
        found = self.fused_read()
        if found is None:
            return None
        kernel, key_fmt, value_fmt = found
        segments = [KVSegment(self._sink_k, self._sink_v)] if self._sink_tokens else []
        segments += [KVSegment(pk.tensors, pv.tensors, key_fmt, value_fmt)
                     for pk, pv in self._blocks()]
        segments.append(KVSegment(self._raw_k, self._raw_v))
        if exact is not None:
            segments = [*newest_dropped(segments, exact[0].shape[-2]), KVSegment(*exact)]
        return PackedRead(kernel, [segment for segment in segments if segment.tokens])

    def fused_read(self) -> tuple[str, KernelFormat, KernelFormat] | None:
        """(kernel, key format, value format) of the fused decode read of what it holds, or None."""
        if self._decoded is not None or self._raw_k is None:
            return None
        return self._fused.find(self._raw_k.device, self._raw_k.shape[-1])

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        return self._sink_tokens + self._packed_tokens + self._tails[0].tokens

    @property
    def retained_bytes(self) -> int:
        packed = sum(self.key_codec.nbytes(pk) + self.value_codec.nbytes(pv)
                     for pk, pv in self._blocks())
        return packed + self.ops.nbytes(self._sink_k, self._sink_v, self._raw_k, self._raw_v)

    def measured_bytes(self) -> int:
        held = [t for pk, pv in self._blocks()
                for t in (*pk.tensors.values(), *pv.tensors.values())]
        decoded = [] if self._decoded is None else [*self._decoded[0].chunks,
                                                    *self._decoded[1].chunks]
        return self.ops.held_bytes(*held, self._sink_k, self._sink_v,
                                   *(tail.held for tail in self._tails), *decoded)


class WindowedCodecCache(CodecWindow, CodecCache):
    """A CodecCache of a sliding-window layer (kvbench.methods.core.window_cache)."""


class CodecMethod(Implementation):
    """A method that stores keys and values with its one codec in a CodecCache, the first
    `sinks` and the newest `window` tokens (the settings' sinks and window; unset sinks: none)
    in full precision: intq, lloydmax, turbo, identity, and a plug-in quantizer that returns its
    codec from codec() (tests/data/example_quant_plugin)."""

    @property
    def window(self) -> int:
        return self.settings.window

    @property
    def sinks(self) -> int:
        return getattr(self.settings, "sinks", None) or 0

    @property
    def in_place(self) -> bool:
        """Whether the caches write tokens into room kept for them (CodecCache's in_place)."""
        return getattr(self.settings, "storage", None) != "concat"

    @property
    def shares_prefill(self) -> bool:
        return self.prefill_reads == "exact" or self.window >= UNBOUNDED_WINDOW

    @property
    def shares_chunked_prefill(self) -> bool:
        return self.window >= UNBOUNDED_WINDOW  # exact reads: a forward's own tokens only

    def new_layer_cache(self, layer_idx: int) -> CodecCache:
        return CodecCache(*self.layer_codecs, self.window, self.on.arrays, sinks=self.sinks,
                          in_place=self.in_place)

    def new_window_cache(self, layer_idx: int, window: int) -> CodecCache:
        return WindowedCodecCache(*self.layer_codecs, self.window, window, self.on.arrays)

    @functools.cached_property
    def layer_codecs(self) -> tuple[Codec, Codec]:
        """The key and the value codec, one object every layer of every cache shares (it keeps
        nothing it packed): a batched step packs all its rows at once (append_rows)."""
        codec = self.codec()
        return codec, codec


def append_rows(policies: list[LayerCachePolicy], keys, values) -> None:
    """Row i of keys and values (rows, kv_heads, tokens, head_dim) appended to policies[i]:
    CodecCaches sharing chunk_separable codecs and packing as many tokens now pack all their rows
    in one encode (each row's bytes its own encode's); any other policy appends its row alone."""
    groups: dict[tuple, list] = {}
    for row, policy in enumerate(policies):
        k, v = keys[row : row + 1], values[row : row + 1]
        codecs = (getattr(policy, "key_codec", None), getattr(policy, "value_codec", None))
        if type(policy) is not CodecCache or not all(c.chunk_separable for c in codecs):
            policy.append(k, v)
            continue
        spilled = policy._extend(k, v)
        if spilled is not None:
            group = (*map(id, codecs), spilled[0].shape[-2])
            groups.setdefault(group, []).append((policy, spilled))
    for members in groups.values():
        first = members[0][0]
        pk, pv, value_row = encode_rows(first.key_codec, first.value_codec,
                                        [k for _, (k, _) in members],
                                        [v for _, (_, v) in members], first.ops)
        tokens = members[0][1][0].shape[-2]
        for row, (policy, _) in enumerate(members):
            policy._store(packed_row(pk, row), packed_row(pv, value_row + row), tokens,
                          views=True)


def encode_rows(key_codec: Codec, value_codec: Codec, keys: list, values: list,
                ops) -> tuple[Packed, Packed, int]:
    """`keys` and `values` joined along the batch and packed, in one encode where one codec packs
    both: (packed keys, packed values, the row of the packed values where the values begin)."""
    if key_codec is value_codec:
        packed = key_codec.encode(ops.concat([*keys, *values], axis=0))
        return packed, packed, sum(k.shape[0] for k in keys)
    return (key_codec.encode(ops.concat(keys, axis=0)),
            value_codec.encode(ops.concat(values, axis=0)), 0)


def packed_row(packed: Packed, row: int) -> Packed:
    """Row `row` of a Packed of several sequences (their batch axis first), as views."""
    tensors = {name: t[row : row + 1] for name, t in packed.tensors.items()}
    return Packed(tensors, (1, *packed.shape[1:]), packed.dtype, dict(packed.meta))
