"""The newest tokens of one side of a layer's cache (keys or values) as the model made them, in a
buffer with room to grow: a step writes its tokens where the filled ones end instead of joining
them with everything held (a copy of the whole side, per layer, per step: what transformers'
DynamicCache does, and identity's decode spent ~300 ms of its ~600 ms step on at 32k tokens).
Attention reads a view of the filled part.

The buffer holds what the cache was told it will hold (LayerCachePolicy.reserve), else the
tokens with ROOM_TOKENS more; it grows by a copy when full. Arrays that are not written in
place (MLX's), or a cache asked to join (`in_place` False: the DynamicCache-style baseline),
join as before.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

# Room a buffer keeps past its tokens when nothing was reserved: it is copied into a larger one
# once every so many decode steps, and holds at most this much unused.
ROOM_TOKENS = 256


class Tail:
    """Tokens along axis -2 of arrays (batch, heads, tokens, dim), appended in order."""

    def __init__(self, ops, in_place: bool = True):
        self.ops = ops
        self.in_place = in_place
        self.held = None  # the buffer, or (joined) exactly the tokens; None before any token
        self.buffered = False  # whether `held` is a buffer written in place
        self.tokens = 0
        self.offer = None  # a buffer the first extend takes (offered)

    @property
    def array(self):
        """The filled tokens (a view of the buffer), or None before the first."""
        if not self.buffered:
            return self.held
        return self.held if self.held.shape[-2] == self.tokens else self.held[..., :self.tokens, :]

    def extend(self, x, reserved: int = 0) -> None:
        """`x`'s tokens after the filled ones; `reserved`: the tokens the cache will hold."""
        needed = self.tokens + x.shape[-2]
        if self.held is None and self.offer is not None:
            # its first tokens are x: held with the room after them, or as given (no room)
            self.held, self.tokens = self.offer, needed
            self.buffered = self.in_place and self.offer.shape[-2] > needed
            if not self.buffered:
                self.held = self.offer[..., :needed, :]
            return
        if self.buffered and needed <= self.held.shape[-2]:
            self.ops.write(self.held, self.tokens, x, -2)
            self.tokens = needed
            return
        grown = None
        if self.in_place:
            capacity = reserved if reserved >= needed else needed + ROOM_TOKENS
            grown = self.ops.with_room(x if self.held is None else self.array, -2, capacity)
        if grown is None:
            self.held = self.ops.extend(self.held, x)
        else:
            if self.held is not None:
                self.ops.write(grown, self.tokens, x, -2)
            self.held, self.buffered = grown, True
        self.tokens = needed

    def take_front(self, n: int):
        """The first `n` tokens, removed. Joined: a view of the old array, which gives way to a
        copy of the rest (so the rest does not pin it); buffered: a copy (the buffer is written
        again), the rest moved to the front."""
        rest = self.held[..., n:self.tokens, :]
        if not self.buffered:
            front, self.held = self.held[..., :n, :], self.ops.copy(rest)
        else:
            front = self.ops.copy(self.held[..., :n, :])
            if self.tokens > n:
                self.ops.write(self.held, 0, self.ops.copy(rest), -2)
        self.tokens -= n
        return front

    def replace(self, x) -> None:
        """Hold exactly `x` (a policy's kept tokens); the next extend moves them to a buffer."""
        self.held, self.buffered = x, False
        self.tokens = 0 if x is None else x.shape[-2]

    def trim(self, n: int) -> None:
        """Forget the newest `n` tokens."""
        self.tokens -= n
        if not self.buffered:
            self.held = self.held[..., :self.tokens, :]


@contextlib.contextmanager
def offered(tails: tuple[Tail, ...], buffers: tuple) -> Iterator[None]:
    """Within the block, each tail's first extend() takes its buffer, whose first tokens are the
    ones it is given, as its own instead of copying them (a shared prefill's recording, handed
    over: LayerCachePolicy.take_prompt)."""
    for tail, buffer in zip(tails, buffers, strict=True):
        tail.offer = buffer
    try:
        yield
    finally:
        for tail in tails:
            tail.offer = None
