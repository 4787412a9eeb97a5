"""What the torch and MLX intq codecs share apart from their arrays: the layout they hold, when
parts can merge, and the layout's description."""
from __future__ import annotations

from kvbench.kernels.formats import IntQFormat
from kvbench.methods.core.contracts import Packed


class IntQLayout:
    """bits, group_size and axis ("token": groups along a token's channels; "channel": along a
    channel's tokens) of an intq codec."""

    def __init__(self, bits: int, group_size: int, axis: str):
        self.bits = bits
        self.group_size = group_size
        self.axis = axis
        self.token_block = IntQFormat(bits, group_size, axis).token_block

    def stacking_axis(self, packed: Packed) -> int | None:
        return len(packed.shape) - 2 if self.axis == "token" else None

    def merge_axis(self, parts: list[Packed]) -> int | None:
        """The stored arrays' axis `parts` join along, or None where they cannot join."""
        if self.axis == "token":
            return -2  # rows are tokens: blocks stack
        if all(p.shape[-2] % self.group_size == 0 and p.shape[-2] * self.bits % 8 == 0
               for p in parts[:-1]):
            return -1  # rows are channels: whole groups and whole bytes join end to end
        return None

    def layout(self) -> str:
        along = "channels per token" if self.axis == "token" else "tokens per channel"
        return (f"intq {self.bits}-bit, groups of {self.group_size} {along} (axis {self.axis}), "
                f"fp16 scale+min per group")
