"""A prompt prefilled once, handed to every method whose prefill forward is the plain model's
(Implementation.shares_prefill): the methods of a run answer the same samples, and re-running
the same forward per method was most of a RULER case's time.

The prefill runs once through a recording cache: each layer keeps the keys and values the model
made and the post-RoPE queries (a policy that observes queries gets SDPA's output, as the plain
model's attention does, so the forward is the plain one). A method's fresh cache then ingests
them layer by layer, as its own prefill step would have appended them and shown it the
queries. It works alike on torch (transformers) and MLX (mlx-lm): the cache host is shared.
PrefillStore keeps recorded prompts on disk for the run, within a budget. A run's cases go method
by method over the same samples, so a prompt is asked for again only after every other sample of
its case: when a case's prompts do not all fit, the first ones are kept and the rest made again
(dropping the oldest, as a plain LRU would, keeps only prompts no one asks for next).
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

DISK_BUDGET = 16 << 30  # at most this, and at most half the free disk when the store opens
PREFIX = "kvbench-prefill-"  # then host-pid-: a store whose process is gone is removed


@dataclass
class PrefilledPrompt:
    logits: torch.Tensor  # (1, vocab) float32: the prompt's last position
    # per layer: keys, values (1, kv_heads, tokens, head_dim), queries (1, heads, tokens, dim),
    # as the session's backend holds them
    layers: list[tuple[Any, Any, Any]]
    seconds: float  # the forward's
    arrays: Arrays  # the backend's array operations (kvbench.backends.arrays)


class _Recorder(LayerCachePolicy):
    observes_queries = True

    def __init__(self):
        self.keys = self.values = self.queries = None

    def append(self, keys, values, queries=None) -> None:
        if self.keys is not None:
            raise RuntimeError("a recorded prefill is one forward")
        self.keys, self.values = keys, values

    def attention_inputs(self):
        return self.keys, self.values, None

    def observe_queries(self, queries) -> None:
        self.queries = queries

    @property
    def seen_tokens(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    retained_tokens = seen_tokens

    @property
    def retained_bytes(self) -> int:
        return 0

    def measured_bytes(self) -> int:
        return 0


class _Recording:
    """What CacheHost asks of a method, for recording caches."""

    prefill_reads = "stored"  # the recorder stores what the model made: nothing to replace

    def new_layer_cache(self, layer_idx: int) -> _Recorder:
        return _Recorder()


def prefill_plain(session, ids: list[int]) -> PrefilledPrompt:
    """One forward of `ids` from an empty cache, recorded (session: a TorchSession or an
    MLXSession)."""
    cache = session.new_cache(_Recording())
    logits, seconds = session.step(ids, cache, last_only=True)
    layers = [(p.keys, p.values, p.queries) for p in cache.policies]
    return PrefilledPrompt(logits, layers, seconds, cache.layers[0].arrays)


def ingest(cache, prompt: PrefilledPrompt) -> None:
    """Hand `prompt` to a method's fresh cache (a KVBenchCache or MLXKVBenchCache), as its
    prefill step would have. Copies: a policy may keep what it is given, and the next method
    gets the same prompt."""
    for layer, recorded in zip(cache.layers, prompt.layers, strict=True):
        layer.ingest(*(prompt.arrays.copy(a) for a in recorded))


class PrefillStore:
    """Recorded prompts of one run, by model and tokens, kept on disk within a budget (the
    running case's prompts kept over any other, see expect); made again when asked for after
    being dropped or not kept."""

    def __init__(self, budget: int | None = None):
        remove_orphaned_stores(Path(tempfile.gettempdir()))
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_owner()}-"))
        # removed on close(), when collected, or at exit: a store nobody closed is not left
        self._remove = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        free = shutil.disk_usage(self.folder).free
        self.budget = min(DISK_BUDGET, free // 2) if budget is None else budget
        self._files: OrderedDict[str, tuple[Path, int, Arrays]] = OrderedDict()
        self._expected: set[str] = set()
        self.made = self.reused = 0

    def expect(self, session, prompts: list[list[int]]) -> None:
        """The prompts the case now running will ask for: stored only while they fit, and never
        dropped for one another; any other is dropped first (oldest first)."""
        self._expected = {_key(session, ids) for ids in prompts}

    def get(self, session, ids: list[int]) -> PrefilledPrompt:
        key = _key(session, ids)
        if key in self._files:
            self._files.move_to_end(key)
            self.reused += 1
            path, _, arrays = self._files[key]
            saved = torch.load(path, weights_only=True)
            layers = [tuple(t if arrays.name == "torch" else arrays.from_torch(t) for t in layer)
                      for layer in saved["layers"]]
            return PrefilledPrompt(saved["logits"], layers, saved["seconds"], arrays)
        prompt = prefill_plain(session, ids)
        self.made += 1
        self._keep(key, prompt)
        return prompt

    def _keep(self, key: str, prompt: PrefilledPrompt) -> None:
        arrays = prompt.arrays
        size = arrays.nbytes(*(a for layer in prompt.layers for a in layer))
        if size > self.budget:
            return
        while sum(n for _, n, _ in self._files.values()) + size > self.budget:
            other = next((k for k in self._files if k not in self._expected), None)
            if other is None:  # full of this case's earlier prompts: keep those
                return
            self._files.pop(other)[0].unlink(missing_ok=True)
        path = self.folder / f"{key}.pt"
        # torch tensors as they are (torch.load puts them back on their device), MLX arrays as
        # torch tensors (an exact round trip, bfloat16 included)
        layers = [[a if arrays.name == "torch" else arrays.to_torch(a) for a in layer]
                  for layer in prompt.layers]
        torch.save({"logits": prompt.logits, "layers": layers, "seconds": prompt.seconds}, path)
        self._files[key] = (path, size, arrays)

    def close(self) -> None:
        self._remove()
        self._files.clear()


def _key(session, ids: list[int]) -> str:
    return hashlib.sha256(repr((session.memo_key, ids)).encode()).hexdigest()


def remove_orphaned_stores(folder: Path) -> list[Path]:
    """Removes the stores in `folder` made on this host by a process that is gone: a killed run
    (a case's timeout under --isolate, an out-of-memory kill, a session's end) cannot close its
    own, and each may hold up to DISK_BUDGET. Returns what it removed."""
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
