"""A quantizer's cache of a sliding-window layer (`layers: all`, what vLLM's fp8 KV cache and
llama.cpp's -ctk/-ctv do): the model's window of W tokens (each query sees the last W, itself
included) held in the quantizer's packed form.

As transformers' DynamicSlidingWindowLayer keeps it: a step's read is the W - 1 tokens kept
before it and the step's own (so a prefill longer than the window reads all of it, under the
model's sliding mask); once read (LayerCachePolicy.after_read), every token older than the
newest W - 1 is dropped, so the model's mask sizes (kvbench.models.hf_cache.PolicyLayer:
kept + step keys, offset seen - kept) are that layer's, and a one-token step, which reads every
key kept, sees exactly the window. The quantizer's own full-precision `window` is capped at
W - 1; `sinks` do not apply (the model's window hides the first tokens like any other).

Dropped tokens leave the packed form as it is stored: a per-token layout is cut at any token; a
per-channel one (KIVI's keys, intq axis channel) in whole groups over tokens, its first tokens
past the window kept packed and not read (`hidden`) until their group leaves, so the read skips
them (its fused read too: KIVI's reads from inside a group; a CodecCache's is not taken while
any is hidden). Its bytes are then the window's packed and raw tokens and at most group - 1
hidden packed ones: below the plain window's wherever the packed groups in the window outweigh
them (every layout cut per token, and KIVI below its residual, whose window stays raw: its
bytes are the plain window's).
"""
from __future__ import annotations

from typing import Any

from kvbench.kernels.formats import is_channel
from kvbench.methods.core.contracts import Codec, Packed


def cut_step(codec: Codec, packed: Packed) -> int:
    """The tokens a packed block can be cut at multiples of, as stored: 1 where its arrays
    stack tokens, whole groups of whole bytes of codes in a per-channel layout, 0: nowhere."""
    if codec.stacking_axis(packed) is not None:
        return 1
    fmt = codec.format
    if not is_channel(fmt):
        return 0
    step = fmt.group_size
    while step * fmt.bits % 8:
        step += fmt.group_size
    return step


def cuttable(codec: Codec, packed: Packed, tokens: int) -> int:
    """How many of a packed block's first `tokens` tokens can be cut off it as stored."""
    if tokens >= packed.shape[-2]:
        return packed.shape[-2]
    step = cut_step(codec, packed)
    return tokens - tokens % step if step else 0


def token_range(codec: Codec, packed: Packed, start: int, stop: int) -> Packed:
    """Tokens [start, stop) of `packed` as views of its arrays, both ends at multiples of
    cut_step or at its end."""
    axis = codec.stacking_axis(packed)
    if axis is not None:
        index = (slice(None),) * axis + (slice(start, stop),)
        tensors = {name: t[index] for name, t in packed.tensors.items()}
    else:
        stored = codec.format.stored_tokens
        tensors = {name: t[..., stored(name, start) : stored(name, stop)]
                   for name, t in packed.tensors.items()}
    return Packed(tensors, (*packed.shape[:-2], stop - start, packed.shape[-1]), packed.dtype,
                  packed.meta)


def cut_front(codec: Codec, packed: Packed, tokens: int, ops) -> Packed:
    """`packed` without its first `tokens` tokens (cuttable), as copies (a view would pin what
    was dropped)."""
    kept = token_range(codec, packed, tokens, packed.shape[-2])
    return Packed({name: ops.copy(t) for name, t in kept.tensors.items()}, kept.shape,
                  kept.dtype, kept.meta)


def drop_front(codecs: tuple[Codec, ...], blocks: list[tuple[Packed, ...]], tokens: int,
               ops) -> tuple[list[tuple[Packed, ...]], int]:
    """Packed blocks in token order (one Packed per codec in each: keys and values, or one
    side) without as many of their first `tokens` tokens as can go: (the blocks, tokens
    dropped)."""
    kept, dropped = list(blocks), 0
    while kept and tokens - dropped >= kept[0][0].shape[-2]:
        dropped += kept.pop(0)[0].shape[-2]
    if kept and tokens > dropped:
        cut = min(cuttable(codec, packed, tokens - dropped)
                  for codec, packed in zip(codecs, kept[0]))
        if cut:
            kept[0] = tuple(cut_front(codec, packed, cut, ops)
                            for codec, packed in zip(codecs, kept[0]))
            dropped += cut
    return kept, dropped


class LayerWindow:
    """What a windowed cache of either kind does after each read: drops its tokens older than
    the newest `limit` (drop_oldest), counting them in `gone`; no decoded-once path (the
    window's front moves at every step)."""

    limit: int
    gone: int
    retained_tokens: int

    def keep_decoded(self) -> bool:
        return False

    def after_read(self) -> None:
        excess = self.retained_tokens - self.limit
        if excess > 0:
            self.drop_oldest(excess)
            self.gone += excess

    def drop_oldest(self, tokens: int) -> None:
        raise NotImplementedError


class CodecWindow(LayerWindow):
    """Mixin of a CodecCache (intq, lloydmax, turbo; codec_cache.WindowedCodecCache) of a
    sliding-window layer of `layer_window` tokens: its full-precision `window` capped at
    layer_window - 1, no sinks, tokens joined at every step (no room kept: a window's front
    moves), no decoded-once path."""

    def __init__(self, key_codec: Codec, value_codec: Codec, window: int, layer_window: int,
                 ops):
        super().__init__(key_codec, value_codec, min(window, layer_window - 1), ops,
                         in_place=False)
        self.limit = layer_window - 1  # tokens kept between steps
        self.hidden = 0  # the first packed tokens, past the window, not read
        self.gone = 0  # tokens dropped

    def drop_oldest(self, tokens: int) -> None:
        cut = self.hidden + tokens  # stored tokens to go, from the front
        self._packed, dropped = drop_front((self.key_codec, self.value_codec), self._blocks(),
                                           cut, self.ops)
        self._packed_tokens -= dropped
        if not self._packed_tokens and cut > dropped:  # the rest from the raw tail
            for tail in self._tails:
                tail.take_front(cut - dropped)
            dropped = cut
        self.hidden = cut - dropped

    def _read_parts(self) -> tuple[list, list]:
        keys, values = super()._read_parts()
        if self.hidden:  # the first part is the first packed block, decoded
            keys[0], values[0] = keys[0][..., self.hidden:, :], values[0][..., self.hidden:, :]
        return keys, values

    def attention_segments(self, exact: tuple | None = None):
        return None if self.hidden else super().attention_segments(exact)

    def attention_parts(self, part_bytes: int):
        return None  # a window's read: the window, read whole

    def trim(self, n: int) -> int:
        """As a CodecCache until a token left the window; then none (it cannot come back)."""
        return 0 if self.gone or self.hidden else super().trim(n)

    @property
    def seen_tokens(self) -> int:
        return self._packed_tokens + self._tails[0].tokens + self.gone

    @property
    def retained_tokens(self) -> int:
        return self._packed_tokens + self._tails[0].tokens - self.hidden


class KiviWindow(LayerWindow):
    """Mixin of KIVI's cache (kivi_cache.WindowedKiviCache) of a sliding-window layer of
    `layer_window` tokens: each side drops what left the window (KIVI's keys per channel in
    whole groups, the rest hidden); no decoded-once path."""

    def __init__(self, key_codec: Codec, value_codec: Codec, residual: int, group_size: int,
                 ops, layer_window: int):
        super().__init__(key_codec, value_codec, residual, group_size, ops)
        self.limit = layer_window - 1
        self.gone = 0

    def drop_oldest(self, tokens: int) -> None:
        for stream in (self.keys, self.values):
            drop_stream_front(stream, stream.hidden + tokens)

    @property
    def seen_tokens(self) -> int:
        return self.retained_tokens + self.gone


def drop_stream_front(stream: Any, tokens: int) -> None:
    """A KIVI stream without its first `tokens` stored tokens, those that a packed group still
    holds beside tokens in the window left hidden."""
    blocks, dropped = drop_front((stream.codec,), [(p,) for p in stream.packed], tokens,
                                 stream.ops)
    stream.packed = [p for (p,) in blocks]
    stream.packed_tokens -= dropped
    if not stream.packed_tokens and tokens > dropped:
        stream.raw = stream.ops.copy(stream.raw[..., tokens - dropped:, :])
        dropped = tokens
    stream.hidden = tokens - dropped
