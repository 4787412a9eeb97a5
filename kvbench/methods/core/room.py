"""A packed block with room to grow in place: a cache told how many tokens it will hold
(LayerCachePolicy.reserve, e.g. the server's prompt + max_tokens) keeps its packed tokens in
arrays with space for more of them, so a decode step writes its token where the block ends
instead of joining the whole block with it (a copy of every packed byte, per layer, per
sequence, per step). The room is held, so the cache's measured bytes count it; its accounted
bytes are the filled part."""
from __future__ import annotations

from kvbench.methods.core.contracts import Packed


class Room:
    """Every stored array of a Packed, `capacity` tokens long along `axis`, the first `tokens`
    filled."""

    def __init__(self, tensors: dict, axis: int, capacity: int, like: Packed):
        self.tensors, self.axis, self.capacity = tensors, axis, capacity
        self.like = like
        self.tokens = 0

    @classmethod
    def around(cls, packed: Packed, axis: int, capacity: int, ops) -> Room | None:
        """A room of `capacity` tokens holding `packed`; None where `ops`' arrays cannot be
        written in place."""
        tensors = {}
        for name, t in packed.tensors.items():
            held = ops.with_room(t, axis, capacity)
            if held is None:
                return None
            tensors[name] = held
        room = cls(tensors, axis, capacity, packed)
        room.tokens = packed.shape[-2]
        return room

    def fits(self, tokens: int) -> bool:
        return self.tokens + tokens <= self.capacity

    def write(self, packed: Packed, ops) -> None:
        """`packed`'s tokens after the filled ones (a copy: `packed` may be a view of a larger
        encode)."""
        for name, t in packed.tensors.items():
            ops.write(self.tensors[name], self.tokens, t, self.axis)
        self.wrote(packed.shape[-2])

    def wrote(self, tokens: int) -> None:
        """`tokens` more were written after the filled ones (by write(), or by a kernel that
        writes many rooms at once: the cache counts them, CodecCache.stepped)."""
        self.tokens += tokens

    def filled(self) -> Packed:
        """The filled tokens, as views."""
        tensors = {name: t.narrow(self.axis, 0, self.tokens) for name, t in self.tensors.items()}
        shape = (*self.like.shape[:-2], self.tokens, self.like.shape[-1])
        return Packed(tensors, shape, self.like.dtype, self.like.meta)
