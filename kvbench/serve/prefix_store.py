"""The server's prefix cache: the method's cache of a prompt's first chunks, kept to start later
prompts that begin with the same tokens (a shared system prompt, a conversation's earlier turns).

The engine prefills in chunks whose boundaries are fixed by the prompt alone (every
`prefill_chunk` tokens from its start), and a chunk attends to the earlier ones as the method's
cache stores them. So the cache after a prompt's first k chunks is the same for every prompt
that begins with those k * prefill_chunk tokens, and a prompt started from a copy of it and fed
its remaining chunks ends bit for bit where a full prefill would: the reuse saves the forwards,
it changes no answer. That holds for a method whose prefill state does not depend on the whole
prompt's length: not for one that evicts while the prompt is fed (its budget is sized from that
length), nor for one that takes a prompt in one forward (kvpress): those are never stored.

What is stored is the method's cache as it stands mid-prefill: for a quantizer, its packed K/V;
for a method that compresses at end_prefill, the prefix uncompressed. Entries are kept least
recently used first out, at most `capacity` of them; their bytes are the caches' measured bytes,
outside the KV budget (kvbench_prefix_cache_bytes says how many).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

from kvbench.methods.core.contracts import Implementation


def reusable(method: Implementation) -> bool:
    """Whether a prefix of the method's cache can start another prompt (see the module)."""
    evicts_while_fed = getattr(method.settings, "evicts_every_chunk", lambda: False)()
    return method.supports().chunked_prefill and not evicts_while_fed


class PrefixStore:
    """Caches of prompt prefixes, a multiple of `chunk` tokens long, keyed by their tokens."""

    def __init__(self, capacity: int, chunk: int, fork: Callable[[Any], Any]):
        self.capacity, self.chunk, self.fork = capacity, chunk, fork
        self._entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._lock = threading.Lock()  # /metrics reads the entries from another thread
        self.hits = self.misses = self.reused_tokens = 0

    def longest(self, prompt: list[int]) -> tuple[int, Any]:
        """(tokens reused, a copy of the cache holding them) for the longest stored prefix of
        `prompt` shorter than it (a prompt's last token must be fed for its logits); (0, None)
        when none is stored."""
        for length in range((len(prompt) - 1) // self.chunk * self.chunk, 0, -self.chunk):
            key = tuple(prompt[:length])
            with self._lock:
                cache = self._entries.get(key)
                if cache is not None:
                    self._entries.move_to_end(key)
            if cache is not None:
                self.hits += 1
                self.reused_tokens += length
                return length, self.fork(cache)
        self.misses += 1
        return 0, None

    def put(self, prefix: list[int], cache: Any) -> None:
        """Keep a copy of `cache`, which holds exactly `prefix` (chunks of the prompt fed so
        far), unless that prefix is stored already."""
        key = tuple(prefix)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
        copy = self.fork(cache)
        with self._lock:
            self._entries[key] = copy
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def state(self) -> dict[str, int]:
        with self._lock:
            caches = list(self._entries.values())
        return {"prefix_cache_entries": len(caches),
                "prefix_cache_bytes": sum(cache.measured_bytes() for cache in caches),
                "prefix_cache_hits": self.hits, "prefix_cache_misses": self.misses,
                "prefix_cache_reused_tokens": self.reused_tokens}
