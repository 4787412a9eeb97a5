"""A prompt prefilled once, handed to every method whose prefill forward is the plain model's
(Implementation.shares_prefill): the methods of a run answer the same samples, and re-running
the same forward per method was most of a RULER case's time.

The prefill runs once through a recording cache, in the forwards (chunks) a method's own prefill
would take: each layer keeps the keys and values the model made and the post-RoPE queries of the
newest tokens that the methods read (Implementation.prompt_queries: none for identity or a
quantizer, snapkv's window; a method that reads every query prefills itself). A method's fresh
cache then ingests them layer by layer, as its own prefill would have appended them and shown it
the queries, without a copy: a policy never writes into what it is given. It works alike on torch
(transformers) and MLX (mlx-lm): the cache host is shared.
PrefillStore keeps recorded prompts on disk for the run, within a budget, and only the prompts a
later case of the run will read. A run's cases go method by method over the same samples, so a
prompt is asked for again only after every other sample of its case: when a case's prompts do
not all fit, the first ones are kept and the rest made again (dropping the oldest, as a plain LRU
would, keeps only prompts no one asks for next).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvbench.backends.arrays import Arrays
from kvbench.methods.core.contracts import LayerCachePolicy

DISK_SHARE = 2  # the store takes at most this share of the disk's free space when it opens
PREFIX = "kvbench-prefill-"  # then host-pid-: a store whose process is gone is removed


@dataclass
class PrefilledPrompt:
    logits: torch.Tensor  # (1, vocab) float32: the prompt's last position
    # per layer: keys, values (1, kv_heads, tokens, head_dim), and the queries (1, heads, n,
    # dim) of the newest n tokens, or None (n = 0), as the session's backend holds them
    layers: list[tuple[Any, Any, Any]]
    seconds: float  # the forwards'
    arrays: Arrays  # the backend's array operations (kvbench.backends.arrays)
    chunk: int = 0  # tokens per forward it was recorded in (0: one forward)
    # per layer: the arrays whose first tokens are its keys and values (room after them for
    # what was reserved), handed over to the first cache that ingests it (None after that)
    buffers: list[tuple[Any, Any]] | None = None

    @property
    def queries(self) -> int:
        """The newest tokens whose queries it holds."""
        held = self.layers[0][2]
        return 0 if held is None else held.shape[-2]


class _Recorder(LayerCachePolicy):
    observes_queries = True

    def __init__(self, arrays: Arrays, queries: int):
        self.arrays, self.keep_queries = arrays, queries
        self.keys = self.values = self.queries = None
        self.tokens = self.capacity = 0

    def reserve(self, tokens: int) -> None:
        self.capacity = max(self.capacity, tokens)

    begin_prompt = reserve  # room for the prompt at least

    def append(self, keys, values, queries=None) -> None:
        # the prompt's room is made at the first chunk (a copy of everything held per chunk
        # would cost a layer's keys and values again), where the backend writes in place
        fed = keys.shape[-2]
        if self.keys is None:
            room = [self.arrays.with_room(x, -2, max(self.capacity, fed)) for x in (keys, values)]
            self.keys, self.values = room if room[0] is not None else (keys, values)
        elif self.keys.shape[-2] > self.tokens:
            for held, x in ((self.keys, keys), (self.values, values)):
                self.arrays.write(held, self.tokens, x, -2)
        else:
            self.keys = self.arrays.concat([self.keys, keys])
            self.values = self.arrays.concat([self.values, values])
        self.tokens += fed

    def attention_inputs(self):
        return self.keys[..., : self.tokens, :], self.values[..., : self.tokens, :], None

    def observe_queries(self, queries) -> None:
        if not self.keep_queries:
            return
        held = queries if self.queries is None else self.arrays.concat([self.queries, queries])
        # a copy of the newest only: the chunk's queries it is cut from are freed
        self.queries = self.arrays.copy(held[..., -self.keep_queries:, :])

    @property
    def seen_tokens(self) -> int:
        return self.tokens

    retained_tokens = seen_tokens

    @property
    def retained_bytes(self) -> int:
        return 0

    def measured_bytes(self) -> int:
        return 0

    def recorded(self) -> tuple[Any, Any, Any]:
        keys, values, _ = self.attention_inputs()
        return keys, values, self.queries

    def buffers(self) -> tuple[Any, Any]:
        return self.keys, self.values


class _Recording:
    """What CacheHost asks of a method, for recording caches."""

    prefill_reads = "stored"  # the recorder stores what the model made: nothing to replace

    def __init__(self, arrays: Arrays, queries: int):
        self.arrays, self.queries = arrays, queries

    def new_layer_cache(self, layer_idx: int) -> _Recorder:
        return _Recorder(self.arrays, self.queries)


def forwards_chunk(chunk: int, tokens: int) -> int:
    """What a prefill of `tokens` in forwards of `chunk` tokens is: 0 where it is one forward."""
    return chunk if 0 < chunk < tokens else 0


def prefill_plain(session, ids: list[int], chunk: int = 0, queries: int = 0,
                  room: int = 0) -> PrefilledPrompt:
    """The plain forwards of `ids` from an empty cache, `chunk` tokens each (0: one), recorded
    with the queries of the newest `queries` tokens (session: a TorchSession or an
    MLXSession), in arrays with room for `room` more tokens where the backend writes in
    place."""
    from kvbench.backends import array_backend

    arrays = array_backend(session.memo_key[0], getattr(session, "device", None))
    cache = session.new_cache(_Recording(arrays, queries))
    session.begin_prompt(cache, len(ids))
    session.reserve(cache, len(ids) + room)
    step, seconds = chunk or len(ids), 0.0
    for start in range(0, len(ids), step):
        logits, took = session.step(ids[start : start + step], cache, last_only=True)
        seconds += took
    layers = [policy.recorded() for policy in cache.policies]
    return PrefilledPrompt(logits, layers, seconds, arrays, forwards_chunk(chunk, len(ids)),
                           [policy.buffers() for policy in cache.policies])


def ingest(cache, prompt: PrefilledPrompt) -> None:
    """Hand `prompt` to a method's fresh cache (a KVBenchCache or MLXKVBenchCache), as its
    prefill would have, without a copy: the first cache takes its arrays over
    (LayerCachePolicy.take_prompt), writing only after the prompt's tokens; any later one is
    handed views (LayerCachePolicy.append: never written into), so it is handed the prompt
    unchanged."""
    buffers, prompt.buffers = prompt.buffers, None
    for i, (layer, recorded) in enumerate(zip(cache.layers, prompt.layers, strict=True)):
        layer.ingest(*recorded, None if buffers is None else buffers[i])


class PrefillStore:
    """Recorded prompts of one run, by model, tokens and chunk, kept on disk within a budget
    (the running case's prompts kept over any other, see expect); made again when asked for
    after being dropped or not kept, or with more queries than were recorded."""

    def __init__(self, budget: int | None = None):
        remove_orphaned_stores(Path(tempfile.gettempdir()))
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_owner()}-"))
        # removed on close(), when collected, or at exit: a store nobody closed is not left
        self._remove = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        free = shutil.disk_usage(self.folder).free
        self.budget = free // DISK_SHARE if budget is None else budget
        self._files: OrderedDict[str, tuple[Path, int, Arrays, int]] = OrderedDict()
        self._expected: set[str] = set()
        self.made = self.reused = self.stored = 0

    def expect(self, session, prompts: list[list[int]], chunk: int = 0) -> None:
        """The prompts the case now running will ask for, and that a later case of the run
        will read again (give none where no later case will: nothing is then stored): stored
        only while they fit, and never dropped for one another; any other is dropped first
        (oldest first)."""
        self._expected = {_key(session, ids, chunk) for ids in prompts}

    def get(self, session, ids: list[int], chunk: int = 0, queries: int = 0,
            room: int = 0) -> PrefilledPrompt:
        """`ids` prefilled in forwards of `chunk` tokens, with the queries of the newest
        `queries` tokens at least, its arrays the caller's to take over (prefill_plain's
        `room`: for the tokens that will follow, when it is made here)."""
        key = _key(session, ids, chunk)
        if key in self._files and self._files[key][3] >= queries:
            self._files.move_to_end(key)
            self.reused += 1
            path, _, arrays, _ = self._files[key]
            saved = torch.load(path, weights_only=True)
            stored = [[t if arrays.name == "torch" or t is None else arrays.from_torch(t)
                       for t in layer] for layer in saved["layers"]]
            tokens = saved["tokens"]
            layers = [(k[..., :tokens, :], v[..., :tokens, :], q) for k, v, q in stored]
            return PrefilledPrompt(saved["logits"], layers, saved["seconds"], arrays,
                                   saved["chunk"], [(k, v) for k, v, _ in stored])
        prompt = prefill_plain(session, ids, chunk, queries, room)
        self.made += 1
        if key in self._expected:
            self._keep(key, prompt)
        return prompt

    def _keep(self, key: str, prompt: PrefilledPrompt) -> None:
        arrays = prompt.arrays
        size = arrays.nbytes(*(a for layer in prompt.layers for a in layer))
        self._drop(key)
        if size > self.budget:
            return
        while sum(n for _, n, _, _ in self._files.values()) + size > self.budget:
            other = next((k for k in self._files if k not in self._expected), None)
            if other is None:  # full of this case's earlier prompts: keep those
                return
            self._drop(other)
        path = self.folder / f"{key}.pt"
        # torch tensors as they are (torch.load puts them back on their device), MLX arrays as
        # torch tensors (an exact round trip, bfloat16 included); the keys and values with the
        # room after them (torch saves a view's whole storage anyway), for the cache it goes to
        buffers = prompt.buffers or [layer[:2] for layer in prompt.layers]
        layers = [[a if arrays.name == "torch" or a is None else arrays.to_torch(a)
                   for a in (*buffer, layer[2])]
                  for buffer, layer in zip(buffers, prompt.layers, strict=True)]
        torch.save({"logits": prompt.logits, "layers": layers, "seconds": prompt.seconds,
                    "chunk": prompt.chunk, "tokens": prompt.layers[0][0].shape[-2]}, path)
        self._files[key] = (path, size, arrays, prompt.queries)
        self.stored += 1

    def _drop(self, key: str) -> None:
        if key in self._files:
            self._files.pop(key)[0].unlink(missing_ok=True)

    def close(self) -> None:
        self._remove()
        self._files.clear()


def _key(session, ids: list[int], chunk: int) -> str:
    step = forwards_chunk(chunk, len(ids))
    return hashlib.sha256(repr((session.memo_key, ids, step)).encode()).hexdigest()


def remove_orphaned_stores(folder: Path) -> list[Path]:
    """Removes the stores in `folder` made on this host by a process that is gone: a killed run
    (a case's timeout under --isolate, an out-of-memory kill, a session's end) cannot close its
    own, and each may hold up to half the free disk. Returns what it removed."""
    removed = []
    host = socket.gethostname()
    for path in folder.glob(f"{PREFIX}*-*-*"):
        owner_host, pid, _ = path.name[len(PREFIX):].rsplit("-", 2)
        if owner_host == host and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
