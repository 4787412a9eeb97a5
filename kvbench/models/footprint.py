"""The memory a model-running case holds (issue 67): the method's caches at their largest, as the
caches report themselves, and what kvbench's own evaluation adds above them and the weights.

The method's caches (kvbench.models.hf_cache.KVBenchCache, its MLX twin, the batched decode step)
call observe() where a forward ends and around end_prefill; the case's tracker (CacheHighWater,
made by kvbench.benchmarks.measure.context.RunContext for a run's case) keeps the most accounted
bytes its method's live caches held at once. CaseFootprint resets the session's peak probe once
the model is loaded and reads it back at the case's end (kvbench.run.case records the figures).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable

from kvbench.backends.process_memory import trim_heap

# the tracker of the case now running (one case at a time per process); None: nothing tracked
_tracking: "CacheHighWater | None" = None

# A one-token step measures a cache only once it has seen STEP_TOKENS or 1/STEP_GROWTH more
# tokens than at its last measurement: accounted_bytes() builds views of every layer's packed
# blocks (0.25 ms for identity, 0.75 ms for intq on the bundled model's 30 layers), which a step
# of 16 rows would pay 16 times. A cache dropped between two measurements (and collected before
# the next flush) is short by that much at most.
STEP_TOKENS = 64
STEP_GROWTH = 64


def observe(*caches: Any, settled: bool = False) -> None:
    """The caches' size now, for the running case's tracker (nothing outside a case): after a
    forward, and `settled` where the size may fall next or has just fallen (around end_prefill,
    after a trim): then the caches are measured at once, with every one left unmeasured since
    its last one-token steps."""
    if _tracking is not None:
        trim_heap()  # the resident peak then counts what is held, not the heap's holes
        _tracking.observe(caches, settled)


def track(tracker: "CacheHighWater | None") -> None:
    """Send observe() to `tracker` from now on (None: to nothing)."""
    global _tracking
    _tracking = tracker


@dataclass
class _Held:
    cache: weakref.ref
    tokens: int  # the tokens it had seen at its last observation
    measured_at: int  # ... at its last measurement
    bytes: int = 0  # accounted, as last measured
    plain: int = 0  # the plain cache's bytes of it, as last measured


class CacheHighWater:
    """The most accounted bytes (cache.accounted_bytes()) that `method`'s live caches held at
    once, summed over the caches alive together (16 rows decoded together count 16 caches), and
    the plain cache's bytes of those caches at that moment (plain_bytes(cache)). Caches are held
    weakly: one counts, at its last measured size, until it is collected, as its arrays do. The
    caches of another method (a shared prefill's recording) do not count.

    A forward of several tokens measures its cache and every cache left unmeasured; one-token
    steps measure a cache each time it has grown by STEP_TOKENS (or 1/STEP_GROWTH), the rest
    waits for the next forward of several tokens, settled observation or the close (flush())."""

    def __init__(self, method: Any, plain_bytes: Callable[[Any], int]):
        self.method, self.plain_bytes = method, plain_bytes
        self._live: dict[int, _Held] = {}  # by id(cache)
        self._unmeasured: set[int] = set()
        self.high = self.plain_at_high = 0
        self.at_restart = 0  # what the live caches held when the probe was last reset
        self.observed = False  # whether any of the method's caches reported

    def observe(self, caches, settled: bool = False) -> None:
        mine = [cache for cache in caches if getattr(cache, "method", None) is self.method]
        if not mine:
            return
        flush, measured = settled, False
        for cache in mine:
            held = self._live.get(id(cache))
            tokens = seen_tokens(cache)
            if held is None or held.cache() is not cache:
                held = self._live[id(cache)] = _Held(weakref.ref(cache), tokens, tokens)
                flush = True  # a new cache: the one it replaces, if dropped, is measured now
            elif tokens != held.tokens + 1:  # not a one-token step
                flush = True
            held.tokens = tokens
            grown = tokens - held.measured_at
            if flush or grown >= max(STEP_TOKENS, held.measured_at // STEP_GROWTH):
                self._measure(cache, held)
                measured = True
            else:
                self._unmeasured.add(id(cache))
        if flush:
            self.flush()
        elif measured:
            self._update()
        self.observed = True

    def _measure(self, cache: Any, held: _Held) -> None:
        held.bytes, held.plain = cache.accounted_bytes(), self.plain_bytes(cache)
        held.measured_at = held.tokens
        self._unmeasured.discard(id(cache))

    def flush(self) -> None:
        """Measure every live cache left unmeasured since its last one-token steps."""
        for key in self._unmeasured.copy():
            held = self._live.get(key)
            cache = held and held.cache()
            if cache is not None:
                self._measure(cache, held)
        self._unmeasured.clear()
        self._update()

    def _update(self) -> None:
        held, plain = self.live()
        if held > self.high or not self.observed:
            self.high, self.plain_at_high = held, plain

    def live(self) -> tuple[int, int]:
        """(accounted bytes, plain cache bytes) of the caches alive now, as last measured."""
        for key in [key for key, held in self._live.items() if held.cache() is None]:
            del self._live[key]
        entries = self._live.values()
        return sum(held.bytes for held in entries), sum(held.plain for held in entries)

    def restart(self) -> None:
        """The peak probe was reset: the high water starts again from what the live caches hold,
        which the probe's start holds too (at_restart)."""
        self.flush()
        self.high, self.plain_at_high = self.live()
        self.at_restart = self.high


def seen_tokens(cache: Any) -> int:
    """The tokens the cache's first hosted layer has seen (-1 for a cache without one: every
    observation of it measures it)."""
    hosts = getattr(cache, "hosts", None)
    return hosts[0].seen_tokens if hosts else -1


@dataclass(frozen=True)
class Reading:
    """What a case's footprint read: the peak since the probe was (last) reset, what was held
    then, the weights, the method's caches at their largest and the plain cache's bytes of them
    at that moment."""

    peak: int
    probe: str  # what the peak measured (CUDA allocator, MLX, the process's resident memory)
    held_at_start: int
    weights: int
    cache_high_water: int
    plain_cache: int
    cache_at_start: int = 0  # the caches alive at the reset (already in held_at_start)

    def figures(self, peak: int | None = None) -> dict[str, float]:
        """The figures a case records (kvbench.benchmarks.specs.base.FOOTPRINT_METRICS), from
        `peak` where the benchmark measured its own since the same reset (ladder's peak_bytes).
        eval_overhead: what the evaluation held at the peak above the start and the caches'
        growth, over the plain cache's bytes (absent without a plain cache to divide by)."""
        peak = self.peak if peak is None else peak
        grown = max(0, self.cache_high_water - self.cache_at_start)
        overhead = max(0, peak - self.held_at_start - grown)
        out = {"peak_bytes": peak, "held_at_start_bytes": self.held_at_start,
               "weights_bytes": self.weights, "cache_high_water_bytes": self.cache_high_water,
               "plain_cache_bytes": self.plain_cache, "eval_overhead_bytes": overhead}
        if self.plain_cache > 0:
            out["eval_overhead"] = overhead / self.plain_cache
        return {name: float(value) for name, value in out.items()}


class CaseFootprint:
    """One case's footprint: `session`'s peak probe reset now (after the model's load: the
    weights are in what it holds at the start), the method's caches tracked meanwhile, read by
    close(). A measurement that resets the probe itself (after a warm-up, or a reference shared
    by the run's cases) moves the start there: watch() makes a session's reset_peak_memory
    restart the footprint too, so the peak and its start stay one interval."""

    def __init__(self, session: Any, method: Any, plain_bytes: Callable[[Any], int]):
        self.session = session
        self.caches = CacheHighWater(method, plain_bytes)
        self.held = session.reset_peak_memory()
        track(self.caches)

    def watch(self, session: Any) -> None:
        reset = session.reset_peak_memory

        def reset_and_restart() -> int:
            self.held = reset()
            self.caches.restart()
            return self.held

        session.reset_peak_memory = reset_and_restart

    def close(self) -> Reading | None:
        """The reading at the case's end; None where none of the method's caches ran (a server
        did the work). Tracking stops."""
        peak, probe = self.session.peak_memory()
        if _tracking is self.caches:
            track(None)
        caches = self.caches
        if not caches.observed:
            return None
        caches.flush()
        return Reading(peak=peak, probe=probe, held_at_start=self.held,
                       weights=self.session.weights_bytes(), cache_high_water=caches.high,
                       plain_cache=caches.plain_at_high, cache_at_start=caches.at_restart)

    def stop(self) -> None:
        """Tracking stops without a reading (a case that failed)."""
        if _tracking is self.caches:
            track(None)
