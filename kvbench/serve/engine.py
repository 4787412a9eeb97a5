"""The serving engine: one model, one method, one cache per request, continuous batching.

A single engine thread owns the model. Between decode steps it admits queued requests (FIFO,
while the KV budget and the batch size allow), prefills each alone through its own cache of the
method (kvbench.models.session.prefill: probe and end_prefill included, as every benchmark does),
then runs one batched forward for the next token of every active request
(kvbench.models.batch_step). A prompt is prefilled in forwards of at most `prefill_chunk` tokens
with a decode step of the active requests after each, as vLLM's chunked prefill: a long prompt
delays the other streams by one chunk at a time, not by its whole prefill. (Chunks attend to the
earlier chunks as the cache stores them; the boundaries are fixed by the prompt alone, so a
request's answer does not depend on what else is served.) A request whose client went away is
dropped at the next step and its cache freed; one still queued is never admitted. Events go back
to whoever submitted the request through its `emit` callback (the HTTP layer bridges them onto
its event loop).

A request may have only its prompt's first `prefill_tokens` prefilled (and compressed at
end_prefill); its later prompt tokens are then fed one at a time through the cache in the decode
steps, as generated tokens are, each scored from the logits before it: the perplexity
benchmark's protocol with decode_chunk 1. With score_prompt, every prompt token's logprob is
sent (Scored) before the first generated token: those inside the prefill from the prefill's own
forwards (kvbench.serve.events.PromptRecorder), the rest from the steps that fed them.

With a prefix cache (kvbench.serve.prefix_store), a prompt that begins with whole chunks stored
from an earlier prompt starts from a copy of their cache and prefills only the rest, bit for bit
as a full prefill would; its own chunks are stored in turn. A request that scores its prompt
prefills all of it (the reused chunks' logits are not kept).

With a KV budget, admission is by the method's accounted bytes: a request reserves what its cache
will hold after its prompt and max_tokens (kvbench.serve.admission), and waits while the
reservations of the active requests and its own would exceed the budget.
"""
from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import TorchSession, default_prefill_chunk, prefill
from kvbench.serve.admission import Projection
from kvbench.serve.events import Failed, Finished, PromptRecorder, Scored
from kvbench.serve.prefix_store import PrefixStore, reusable
from kvbench.serve.request import Request, force, sample

RETRY_AFTER_S = 5  # a 503 for no room in time: the requests ahead will have moved on
SHUTTING_DOWN = Failed(503, "the server is shutting down")


class Abandoned(Exception):
    """The client of the request being prefilled went away: stop its prefill."""


@dataclass
class Totals:
    """Counters since the engine started (Prometheus counters)."""

    prompt_tokens: int = 0  # prefilled: those a prefix cache supplied are not counted
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_rows: int = 0  # rows summed over decode steps: their mean is the mean batch size
    finished: dict[str, int] = field(default_factory=dict)  # outcome -> requests

    def count(self, outcome: str) -> None:
        self.finished[outcome] = self.finished.get(outcome, 0) + 1


class Engine:
    def __init__(self, session: TorchSession, method: Implementation, kv_budget: int | None = None,
                 queue_timeout_s: float = 600.0, max_batch: int = 32, prefill_chunk: int = 0,
                 prefix_cache: int = 0, log: Callable[[str], None] = lambda message: None):
        """prefill_chunk: prompt tokens per forward (0: the model's and device's,
        kvbench.models.session.default_prefill_chunk); prefix_cache: prompt prefixes kept (0:
        none); ValueError where the method's caches cannot start another prompt
        (kvbench.serve.prefix_store.reusable)."""
        self.session, self.method = session, method
        self.kv_budget, self.queue_timeout_s, self.max_batch = kv_budget, queue_timeout_s, max_batch
        self.prefill_chunk = prefill_chunk or default_prefill_chunk(session, serving=True)
        self.stop_ids = session.stop_ids  # the tokenizer's eos and the generation config's
        self.projection = Projection(method, session)
        if prefix_cache and not reusable(method):
            raise ValueError("--prefix-cache: the method evicts while the prompt is fed, or takes"
                             " it in one forward: a prefix of its cache depends on the whole"
                             " prompt, so none can be reused")
        self.prefixes = (PrefixStore(prefix_cache, self.prefill_chunk, session.fork)
                         if prefix_cache else None)
        self.totals = Totals()
        self.log = log
        self._waiting: deque[Request] = deque()
        self._active: list[Request] = []
        self._caches: weakref.WeakSet = weakref.WeakSet()  # every cache not yet freed
        self._lock = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="kvbench-engine", daemon=True)
        self._check: list[int] | None = None
        self._checked = threading.Event()
        self._check_error: Exception | None = None

    # -- the submitting side (any thread) ---------------------------------------------------

    def impl(self) -> dict[str, str]:
        """Which implementation ran each of the method's codec operations so far (its ImplLog:
        encode, decode, decode attention), as a run's info.impl says it; {} for a method
        without kernels."""
        log = self.method.impl_log
        return log.summary() if log is not None else {}

    def start(self, check: list[int] | None = None) -> None:
        """Start the engine thread. With `check` tokens it first prefills them and takes one
        decode step through a fresh cache of the method, as a request would, and start()
        raises what that raised (the thread then ends): a method that cannot run on this model
        (a block wider than its head_dim) fails before the server starts, not on every request.
        The check runs on the engine thread: torch work on the caller's thread (the event
        loop's) left it a thread team of its own, and every later decode step ran ~20% slower."""
        self._check = check
        self._thread.start()
        self._checked.wait()
        if self._check_error is not None:
            self._thread.join()
            raise self._check_error

    def _run_check(self) -> None:
        if self._check:
            cache = self.session.new_cache(self.method)
            logits = prefill(self.session, cache, self._check, self.method)[0]
            self.session.step_rows([int(logits[-1].argmax())], [cache])

    def request_stop(self) -> None:
        """Stop after the step under way: every request queued or active, and any submitted
        from now on, gets 503 (a stream ends with an error event), and the thread ends."""
        with self._lock:
            self._stopping = True
            self._lock.notify()

    def stop(self) -> None:
        self.request_stop()
        self._thread.join()

    def submit(self, request: Request) -> None:
        """Queue `request`; its events arrive through request.emit (from the engine thread)."""
        with self._lock:
            if not self._stopping:
                self._waiting.append(request)
                self._lock.notify()
                return
        request.emit(SHUTTING_DOWN)

    def cancel(self, request: Request, outcome: str = "cancelled") -> None:
        """The client went away (or the reply hit a stop string: outcome "stop"): drop it at
        the next step and free its cache."""
        with self._lock:
            if not request.cancelled:
                request.cancelled, request.cancel_outcome = True, outcome
            self._lock.notify()

    def state(self) -> dict[str, int]:
        """What /metrics shows now: requests, bytes held and reserved, live caches."""
        with self._lock:
            active = list(self._active)
            queued = len(self._waiting)
            reserved = sum(r.reserved for r in active)
        caches = [r.cache for r in active if r.cache is not None]
        stored = self.prefixes.state() if self.prefixes is not None else {}
        return {**stored,
            "active": len(active),
            "queued": queued,
            "kv_accounted_bytes": sum(cache.accounted_bytes() for cache in caches),
            "kv_measured_bytes": sum(cache.measured_bytes() for cache in caches),
            "kv_reserved_bytes": reserved,
            "live_caches": len(self._caches),
        }

    # -- the engine thread ------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._run_check()
        except Exception as exc:  # noqa: BLE001 - start() raises it
            self._check_error = exc
            return
        finally:
            self._checked.set()
        while True:
            with self._lock:
                idle = not (self._stopping or self._waiting or self._active)
            if idle:  # caches hold reference cycles: free the finished ones before waiting
                gc.collect()
            with self._lock:
                while not (self._stopping or self._waiting or self._active):
                    self._lock.wait()
                if self._stopping:
                    break
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - a bug must not leave clients waiting
                self.log(f"engine step failed: {exc!r}")
                self._fail_all(Failed(500, f"the engine failed: {exc}"))
        self._fail_all(SHUTTING_DOWN)

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        if self._active:
            self._decode_step()
        elif self._waiting:  # all waiting, none fits yet: let time pass toward the timeout
            with self._lock:
                self._lock.wait(0.05)

    def _fail_all(self, failure: Failed) -> None:
        with self._lock:
            requests, self._waiting = [*self._active, *self._waiting], deque()
        for request in requests:
            request.emit(failure)
            self._release(request, "error")

    def _drop_cancelled(self) -> None:
        with self._lock:
            for request in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(request)
                self.totals.count(request.cancel_outcome)
            for request in [r for r in self._active if r.cancelled]:
                self._release(request, request.cancel_outcome)

    def _admit(self) -> None:
        """Start queued requests in order while they fit; past the queue timeout, 503."""
        while True:
            with self._lock:
                if not self._waiting or self._stopping:
                    return
                request = self._waiting[0]
                if request.cancelled:  # its client left while it waited: never prefilled
                    self._waiting.popleft()
                    self.totals.count(request.cancel_outcome)
                    continue
                held = sum(r.reserved for r in self._active)
                full = len(self._active) >= self.max_batch
            try:
                need = self._reservation(request)
            except ValueError as exc:  # it can never fit: asking again will not help
                self._reject(request, Failed(400, str(exc)))
                continue
            if full or (self.kv_budget is not None and held + need > self.kv_budget):
                if time.monotonic() - request.queued_at > self.queue_timeout_s:
                    self._reject(request, Failed(503, (
                        f"no room (batch of {self.max_batch}, KV budget {self.kv_budget}) within"
                        f" the queue timeout of {self.queue_timeout_s:g} s"), RETRY_AFTER_S))
                    continue
                return  # FIFO: nothing behind it jumps the queue
            with self._lock:
                self._waiting.popleft()
                request.reserved = need
            self._start(request)

    def _reservation(self, request: Request) -> int:
        """Accounted bytes the request reserves (0 without a budget); ValueError if it can
        never fit or its cache cannot be sized."""
        if self.kv_budget is None:
            return 0
        try:
            # the prompt after prefill_tokens is fed as new tokens are; the last is never fed
            need = self.projection.bytes(request.prefilled, len(request.prompt)
                                         - request.prefilled + request.max_tokens)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
            raise ValueError(f"could not size the request's cache: {exc}") from None
        if need > self.kv_budget:
            raise ValueError(
                f"the request's cache needs {need} bytes ({len(request.prompt)} prompt +"
                f" {request.max_tokens} new tokens), above the whole KV budget of {self.kv_budget}")
        return need

    def _reject(self, request: Request, failure: Failed) -> None:
        with self._lock:
            self._waiting.remove(request)
        self.totals.count("rejected")
        request.emit(failure)

    def _start(self, request: Request) -> None:
        """Prefill the request alone through its own cache, chunk by chunk with a decode step of
        the active requests after each, then go on from its last logits."""
        prompt = request.prompt[:request.prefilled]
        reused = 0

        def between_chunks(fed: int) -> None:
            if fed < len(prompt):
                if self.prefixes is not None:
                    self.prefixes.put(prompt[:fed], request.cache)
                self._drop_cancelled()
                if request.cancelled or self._stopping:
                    raise Abandoned
                if self._active:
                    self._decode_step()

        try:
            if self.prefixes is not None and not request.score_prompt:
                reused, request.cache = self.prefixes.longest(prompt)
            if request.cache is None:
                request.cache = self.session.new_cache(self.method)
            # room for every token it may hold: a step writes its token in place
            request.cache.reserve(len(request.prompt) + request.max_tokens)
            self._caches.add(request.cache)
            if request.seed is not None:
                request.generator = torch.Generator().manual_seed(request.seed)
            # a method that compresses only a prompt's first forward (kvpress) takes it whole
            chunk = self.prefill_chunk if self.method.supports().chunked_prefill else 0
            recorder = (PromptRecorder(self.session, prompt, request.logprobs or 0)
                        if request.score_prompt else None)
            logits = prefill(recorder or self.session, request.cache, prompt, self.method,
                             chunk=chunk, after_chunk=between_chunks, done=reused)[0]
            if request.cancelled:  # it left during its last (or only) chunk
                raise Abandoned
        except Abandoned:
            request.cache = None
            if request.cancelled:
                self.totals.count("cancelled")
            else:  # the server stops: no decode step will come
                self.totals.count("error")
                request.emit(SHUTTING_DOWN)
            return
        except Exception as exc:  # noqa: BLE001
            self.log(f"request {request.id}: prefill failed: {exc!r}")
            request.cache = None
            self.totals.count("error")
            request.emit(Failed(500, f"prefill failed: {exc}"))
            return
        self.totals.prompt_tokens += len(prompt) - reused
        request.forced.extend(request.prompt[len(prompt):])
        if recorder is not None:
            request.prompt_scores = recorder.tokens
            if not request.forced:
                request.emit(Scored(request.prompt_scores))
        with self._lock:
            self._active.append(request)
        self._next_token(request, logits[-1])

    def _decode_step(self) -> None:
        rows = list(self._active)
        try:  # a request's tokens are the same whichever requests share its steps
            logits = self.session.step_rows([r.next_input for r in rows],
                                            [r.cache for r in rows])
        except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving
            self.log(f"decode step of {len(rows)} requests failed: {exc!r}")
            for request in rows:
                request.emit(Failed(500, f"decode failed: {exc}"))
                self._release(request, "error")
            return
        self.totals.decode_steps += 1
        self.totals.decode_rows += len(rows)
        for row, request in enumerate(rows):
            self._next_token(request, logits[row])

    def _next_token(self, request: Request, logits: torch.Tensor) -> None:
        """What follows a forward of the request: its next prompt token scored and fed at the
        next step, or its next token sampled; or its end, at max_tokens (0 included)."""
        try:
            if request.forced:
                force(request, logits)
                if request.forced or request.max_tokens:
                    return  # fed at the next step (the last one too, with tokens to generate)
            token = self._sample(request, logits) if request.max_tokens else None
        except Exception as exc:  # noqa: BLE001 - a request's own failure ends it alone
            self.log(f"request {request.id}: sampling failed: {exc!r}")
            request.emit(Failed(500, f"sampling failed: {exc}"))
            self._release(request, "error")
            return
        if token is None:  # max_tokens 0: the prompt alone (scored, with score_prompt)
            self._finish(request, "length")
            return
        request.generated.append(token.id)
        request.next_input = token.id
        self.totals.generated_tokens += 1
        request.emit(token)
        if len(request.generated) >= request.max_tokens:
            self._finish(request, "length")
        elif token.id in self.stop_ids and not request.ignore_eos:
            self._finish(request, "stop")

    # a method, so that a subclass can make one request's sampling fail (the tests)
    _sample = staticmethod(sample)

    def _finish(self, request: Request, reason: str) -> None:
        request.emit(Finished(reason, len(request.prompt), len(request.generated)))
        self._release(request, reason)

    def _release(self, request: Request, outcome: str) -> None:
        with self._lock:
            if request in self._active:
                self._active.remove(request)
            request.cache, request.reserved = None, 0
        self.totals.count(outcome)
