"""The one place torch and MLX part for arrays: what a method's cache, a benchmark and the
conformance kit do to arrays, behind one face per library (kvbench.backends.torch_arrays,
kvbench.backends.mlx_arrays).

Benchmarks make their data in torch, hand it to the backend (from_torch), run the method's
implementation for that backend, and bring results back to torch (to_torch) for the float64
arithmetic of their metrics, so a metric means the same on both. Timers read the clock only
after the work is done (a device sync on torch, mx.eval of every array in the result on MLX).
Caches hold arrays and use concat, copy, cast, take, zeros and the byte counts; codecs
written once (kvbench.methods.core.turbo_steps) also cast, where and the dtypes; the attention
written once (kvbench.models.biased_attention) also repeat, broadcast_to, tanh, softmax,
maximum and causal_mask, each one library call, so the float arithmetic is the library's own.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence


class Arrays(Protocol):
    name: str
    float32: Any  # the library's dtypes that codecs and attention written once name
    uint8: Any
    bool_: Any

    # ---- what a cache does to what it holds
    def concat(self, arrays: list[Any], axis: int = -2) -> Any:
        """Join along `axis` (tokens by default)."""

    def joined(self, parts: list[Any]) -> Any:
        """What attention reads, as one array: a lone part as it is (a view of what the cache
        holds, read before the cache is written again), several joined along the tokens."""
        return parts[0] if len(parts) == 1 else self.concat(parts)

    def extend(self, held: Any, new: Any) -> Any:
        """`new` tokens after the `held` ones (None: nothing held yet)."""
        return new if held is None else self.concat([held, new])

    def copy(self, x: Any) -> Any:
        """A copy, so a kept slice does not pin the storage it was cut from."""

    def with_room(self, x: Any, axis: int, capacity: int) -> Any | None:
        """x at the start of a new array `capacity` long along `axis` (the rest unset), for
        write(); None where arrays are not written in place (MLX's)."""

    def write(self, into: Any, at: int, x: Any, axis: int) -> None:
        """x into `into` from index `at` along `axis`, in place."""

    def cast(self, x: Any, dtype: Any) -> Any: ...

    def where(self, condition: Any, x: Any, y: Any) -> Any:
        """x where condition holds, else y (either may be a number)."""

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        """The entries of x at `indices` along `axis` (a copy)."""

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        """Zeros of `shape`, of like's dtype (and device)."""

    def nbytes(self, *arrays: Any) -> int:
        """Accounted bytes: each array at its own size (None counts nothing)."""

    def held_bytes(self, *arrays: Any) -> int:
        """Measured bytes: the storages really held, views included."""

    def itemsize(self, x: Any) -> int:
        """Bytes of one element of `x`."""

    # ---- what attention does (kvbench.models.biased_attention)
    def repeat(self, x: Any, repeats: int, axis: int) -> Any:
        """Each entry `repeats` times in a row along `axis` (the query heads of a GQA group)."""

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        """x broadcast to `shape` (a view where the library has them)."""

    def tanh(self, x: Any) -> Any: ...

    def softmax(self, x: Any, axis: int = -1) -> Any:
        """softmax along `axis` in x's dtype (on MLX the precise one: float32 inside)."""

    def maximum(self, x: Any, floor: float) -> Any:
        """x, with every entry below the number `floor` raised to it."""

    def causal_mask(self, queries: int, keys: int, like: Any) -> Any:
        """(queries, keys) bool, True = attend: the queries at the last `queries` positions,
        each seeing every key up to its own (on like's device)."""

    # ---- what a benchmark does to cross over and time
    def from_torch(self, tensor: Any) -> Any: ...

    def to_torch(self, array: Any) -> Any: ...

    def timed(self, fn) -> tuple[Any, float]: ...

    def reference_copy(self, array: Any) -> Any:
        """A plain copy of the same bytes: the bandwidth reference."""
