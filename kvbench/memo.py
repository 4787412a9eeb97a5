"""What a run computes once and its cases share: tokenised texts, a benchmark's reference (quality's
plain logits, compaction's plain answer). The runner makes one Memo per run and passes it in
RunContext, so nothing outlives the run and no test sees values another test made. A value with a
close() method (a server the cases share) is closed when the run ends.

A key is a tuple: first a name for what is stored, then everything the value depends on (model
spec, backend, device, dtype, a hash of the tokens, the sizes), so a value made for one model or
device is never served for another.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")


class Memo:
    def __init__(self) -> None:
        self._values: dict[tuple[Hashable, ...], Any] = {}
        # the cases this process runs after the current one, in order (set by the runner): what
        # a value is worth keeping for (a shared prefill stores only prompts a later case reads)
        self.later: tuple[Any, ...] = ()

    def get(self, key: tuple[Hashable, ...], make: Callable[[], T]) -> T:
        """The value stored under `key`, made by make() the first time it is asked for."""
        if key not in self._values:
            self._values[key] = make()
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def close(self) -> None:
        """Close every stored value that has close(), newest first; forget them all."""
        values, self._values = list(self._values.values()), {}
        for value in reversed(values):
            if callable(getattr(value, "close", None)):
                value.close()
