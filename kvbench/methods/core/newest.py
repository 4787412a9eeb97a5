"""Reads with their newest tokens swapped or left out: a step's keys and values read as the model
made them in place of their stored form (prefill_reads "exact")."""
from __future__ import annotations

from kvbench.kernels.formats import KVSegment


def newest_replaced(parts: list, newest) -> list:
    """`parts` (arrays in token order), their last tokens replaced by `newest` (views, then it)."""
    return [*_without_newest(parts, newest.shape[-2], lambda part: part.shape[-2],
                             lambda part, n: part[..., :n, :]), newest]


def newest_dropped(segments: list[KVSegment], newest: int) -> list[KVSegment]:
    """`segments` (in token order; or a read's parts, kvbench.methods.core.read_parts) without
    their last `newest` tokens."""
    return _without_newest(segments, newest, lambda segment: segment.tokens,
                           lambda segment, n: segment.head(n))


def _without_newest(parts: list, newest: int, tokens, head) -> list:
    """`parts` without their last `newest` tokens: the last one kept cut to head(part, n)."""
    kept = list(parts)
    while newest:
        last = kept.pop()
        if tokens(last) > newest:
            kept.append(head(last, tokens(last) - newest))
            newest = 0
        else:
            newest -= tokens(last)
    return kept
