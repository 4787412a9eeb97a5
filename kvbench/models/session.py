"""A loaded model as benchmarks drive it, the same calls on every backend: a fresh cache (the
method's, or the plain reference cache), forward steps through it with timed wall clock, the end
of prefill, calibration. Logits come back as float32 torch tensors on the CPU, so the metrics are
computed the same way whatever ran the model.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Protocol

import torch

from kvbench.methods.core.contracts import Implementation
from kvbench.models import budgets
from kvbench.models.chat import stop_ids
from kvbench.models.layer_kinds import every_layer_plain, without_attention
from kvbench.models.shared_prefill import PrefilledPrompt, forwards_chunk, ingest


class Session(Protocol):
    spec: str
    tokenizer: Any
    num_layers: int
    num_kv_heads: int
    head_dim: int  # each cached key's width
    value_dim: int  # each cached value's width (head_dim, except under MLA)
    layer_kinds: list  # what each layer caches (kvbench.models.layer_kinds.LayerKind)
    kv_element_size: int  # bytes per cached K/V element in the plain cache (the model's dtype)
    dtype: str  # the model's float dtype: "float32", "bfloat16", ...
    # every id that ends an answer: the tokenizer's eos and the checkpoint's generation config's
    stop_ids: frozenset[int]
    # What the model's outputs depend on: (backend, spec, device, dtype), the start of every
    # run-memo key of a value computed through it.
    memo_key: tuple[str, ...]

    def new_cache(self, method: Implementation | None, decoded_reads: bool = False) -> Any:
        """The method's cache (a KVBenchCache or its MLX twin), or the plain cache for None.
        decoded_reads: ask the method's policies for their decoded-once read path (the same
        outputs, bit for bit; the cache's `decoded_reads` says whether any took it); the plain
        cache ignores it."""

    def step(self, ids: list[int], cache: Any,
             last_only: bool = False) -> tuple[torch.Tensor, float]:
        """(logits (len(ids) or 1, vocab), seconds) of feeding `ids` through `cache`."""

    def step_rows(self, ids: list[int], caches: list) -> torch.Tensor:
        """Logits (rows, vocab) of feeding ids[i] through caches[i] (a method's caches), each
        row's the same bits whatever rows share the step; within float rounding of step()'s."""

    def full_logits(self, ids: list[int], last: int) -> torch.Tensor:
        """Logits (last, vocab) at the last `last` positions of one forward over `ids` without a
        cache."""

    def own_attention_logits(self, ids: list[int], last: int) -> torch.Tensor:
        """full_logits through the model's own attention (transformers' eager; mlx-lm's own):
        the reference every architecture is checked against, not kvbench's attention."""

    def own_decode_logits(self, prompt: list[int], tokens: list[int]) -> torch.Tensor:
        """Logits (1 + len(tokens), vocab): the prompt's last and each token's, fed one at a
        time through the model's own attention and its own plain cache (each step told its
        position): the reference where a model's full forward and its decode differ (Zamba 2's
        Mamba mixer scans a prompt otherwise than it steps)."""

    def begin_prompt(self, cache: Any, tokens: int) -> None:
        """Tell the method's policies the length of the prompt about to be fed."""

    def reserve(self, cache: Any, tokens: int) -> None:
        """Tell the method's policies that the sequence will hold at most `tokens` tokens (they
        may keep room for them: LayerCachePolicy.reserve)."""

    def end_prefill(self, cache: Any) -> float:
        """Seconds the method's end_prefill took (compaction happens here)."""

    def trim(self, cache: Any, n: int) -> None:
        """Rewind the cache by its newest n tokens; ValueError if it cannot take them all back."""

    def fork(self, cache: Any) -> Any:
        """An independent copy of `cache` (a method's or the plain one): both go on from here
        bit for bit as the original would, neither sees the other's tokens (one compressed
        context answered several ways)."""

    def calibrate(self, method: Implementation, tokens: list[int]) -> None:
        """method.calibrate(CalibrationStats of `tokens` on this model, tokens)."""

    def weights_bytes(self) -> int:
        """Bytes of the model's parameters and buffers as loaded."""

    def reset_peak_memory(self) -> int:
        """Reset the peak-memory probe; return the bytes held now (the footprint the peak
        starts from: the loaded model and whatever else the process holds)."""

    def peak_memory(self) -> tuple[int, str]:
        """(bytes, what was measured) since reset_peak_memory()."""

    def free_memory(self) -> int:
        """Bytes the session's device can still allocate now."""

    def activation_bytes_per_token(self) -> int:
        """What one prompt token takes inside one layer's forward (kvbench.models.budgets)."""


class SessionBase:
    """What a Session does alike on every backend. A backend's session passes the class of its
    method's caches, `method_cache` (the plain cache has no policies to tell of a prompt or the
    end of prefill), and gives timed_through and attention_entropy_of."""

    def __init__(self, loaded, method_cache: type):
        self.loaded, self.method_cache = loaded, method_cache
        self.spec, self.tokenizer = loaded.spec, loaded.tokenizer
        self.num_layers, self.num_kv_heads = loaded.num_layers, loaded.num_kv_heads
        self.head_dim, self.layer_kinds = loaded.head_dim, loaded.layer_kinds
        self.stop_ids = stop_ids(loaded.tokenizer, loaded.stop_ids)

    def timed_through(self, cache: Any, work: Callable[[], Any]) -> tuple[Any, float]:
        """(work(), seconds), the clock read once the work done through `cache` is done."""
        raise NotImplementedError

    def attention_entropy_of(self, tokens: list[int], without: frozenset[int]) -> torch.Tensor:
        """CalibrationStats.attention_entropy of `tokens`, NaN rows for the layers `without`."""
        raise NotImplementedError

    def begin_prompt(self, cache, tokens: int) -> None:
        if isinstance(cache, self.method_cache):
            cache.begin_prompt(tokens)

    def reserve(self, cache, tokens: int) -> None:
        if isinstance(cache, self.method_cache):
            cache.reserve(tokens)

    def end_prefill(self, cache) -> float:
        if not isinstance(cache, self.method_cache):
            return 0.0
        return self.timed_through(cache, cache.end_prefill)[1]

    def fork(self, cache):
        return fork_cache(cache)

    def calibrate(self, method: Implementation, tokens: list[int]) -> None:
        without = without_attention(self.layer_kinds)
        stats = CalibrationStats(tokens, self.num_kv_heads,
                                 lambda ids: self.attention_entropy_of(ids, without))
        method.calibrate(stats, tokens)


class TorchSession(SessionBase):
    def __init__(self, loaded, device: torch.device):
        from kvbench.models.hf_cache import KVBenchCache

        super().__init__(loaded, KVBenchCache)
        self.device, self.value_dim = device, loaded.value_dim
        self.kv_element_size = torch.empty((), dtype=loaded.dtype).element_size()
        self.dtype = str(loaded.dtype).removeprefix("torch.")
        self.memo_key = ("torch", self.spec, str(device), self.dtype)

    def new_cache(self, method: Implementation | None, decoded_reads: bool = False):
        from kvbench.models.own_cache import kvbench_cache, plain_cache

        model = self.loaded.model
        if method is None:
            return plain_cache(model)
        return kvbench_cache(model, method, self.num_layers, decoded_reads=decoded_reads,
                             config=model.config, kinds=self.layer_kinds)

    @torch.inference_mode()
    def step(self, ids: list[int], cache, last_only: bool = False) -> tuple[torch.Tensor, float]:
        from kvbench.models.hf_cache import with_cache

        x = torch.tensor([ids], device=self.device)
        keep = 1 if last_only else 0
        if isinstance(cache, self.method_cache):
            run = lambda: cache.forward(self.loaded.model, x, logits_to_keep=keep)  # noqa: E731
        else:
            run = lambda: self.loaded.model(  # noqa: E731
                x, **with_cache(self.loaded.model, cache), use_cache=True, logits_to_keep=keep)
        logits, seconds = self.timed_through(cache, lambda: run().logits)
        return logits[0].float().cpu(), seconds

    def timed_through(self, cache, work: Callable[[], Any]) -> tuple[Any, float]:
        from kvbench.backends.torch_backend import timed

        return timed(work, self.device)

    @torch.inference_mode()
    def step_rows(self, ids: list[int], caches: list) -> torch.Tensor:
        """One batched forward (kvbench.models.batch_step), a single row included; one forward
        a row where a layer is not plain full attention (the library's layer objects hold one
        sequence; the batched read is plain softmax)."""
        from kvbench.models.batch_step import BatchStep

        if not every_layer_plain(self.layer_kinds):
            return torch.cat([self.step([token], cache)[0][-1:] for token, cache
                              in zip(ids, caches, strict=True)])
        return BatchStep(caches).forward(self.loaded.model, ids).cpu()

    @torch.inference_mode()
    def full_logits(self, ids: list[int], last: int) -> torch.Tensor:
        x = torch.tensor([ids], device=self.device)
        return self.loaded.model(x, use_cache=False, logits_to_keep=last).logits[0].float().cpu()

    @torch.inference_mode()
    @contextlib.contextmanager
    def _own_attention(self):
        """The model on transformers' eager attention for the block, back on its own after."""
        model = self.loaded.model
        previous = model.config._attn_implementation
        try:
            model.set_attn_implementation("eager")
            yield model
        finally:
            model.set_attn_implementation(previous)

    def own_attention_logits(self, ids: list[int], last: int) -> torch.Tensor:
        with self._own_attention():
            return self.full_logits(ids, last)

    @torch.inference_mode()
    def own_decode_logits(self, prompt: list[int], tokens: list[int]) -> torch.Tensor:
        from kvbench.models.hf_cache import with_cache
        from kvbench.models.own_cache import plain_cache

        with self._own_attention() as model:
            cache = plain_cache(model)
            rows = [model(torch.tensor([prompt], device=self.device), **with_cache(model, cache),
                          use_cache=True, logits_to_keep=1).logits[0, -1]]
            for position, token in enumerate(tokens, start=len(prompt)):
                rows.append(model(torch.tensor([[token]], device=self.device),
                                  position_ids=torch.tensor([[position]], device=self.device),
                                  **with_cache(model, cache), use_cache=True).logits[0, -1])
        return torch.stack(rows).float().cpu()

    def trim(self, cache, n: int) -> None:
        cache.crop(-n)

    def attention_entropy_of(self, tokens: list[int], without: frozenset[int]) -> torch.Tensor:
        from kvbench.models.capture import attention_entropy

        return attention_entropy(self.loaded.model, tokens, without)

    def weights_bytes(self) -> int:
        model = self.loaded.model
        return sum(t.numel() * t.element_size()
                   for t in (*model.parameters(), *model.buffers()))

    def reset_peak_memory(self) -> int:
        from kvbench.backends.torch_backend import reset_peak_memory

        return reset_peak_memory(self.device)

    def peak_memory(self) -> tuple[int, str]:
        from kvbench.backends.torch_backend import peak_memory

        return peak_memory(self.device)

    def free_memory(self) -> int:
        from kvbench.backends.torch_backend import free_memory

        return free_memory(self.device)

    def activation_bytes_per_token(self) -> int:
        config = self.loaded.model.config.get_text_config()
        return budgets.activation_bytes_per_token(config, self.kv_element_size)


class CalibrationStats:
    """What a session hands Implementation.calibrate in place of the model: statistics of the
    calibration tokens on the case's model and backend, each measured when a method first asks
    for it (a method that needs none costs no pass). A method calibrates from these tensors; it
    never drives a model itself."""

    def __init__(self, tokens: list[int], num_kv_heads: int,
                 measure_attention_entropy: Callable[[list[int]], torch.Tensor]):
        self.tokens = list(tokens)
        self.num_kv_heads = num_kv_heads
        self._measure_attention_entropy = measure_attention_entropy
        self._attention_entropy: torch.Tensor | None = None

    def attention_entropy(self) -> torch.Tensor:
        """float64 (layers, query heads): the mean entropy, in bits, of each query head's
        attention rows in one causal pass over the tokens (row i attends to i + 1 keys); NaN
        for a layer without attention (linear attention, Mamba)."""
        if self._attention_entropy is None:
            self._attention_entropy = self._measure_attention_entropy(self.tokens)
        return self._attention_entropy


def fork_cache(cache: Any) -> Any:
    """A deep copy of `cache` that shares its method (the implementation, its codecs and
    tables: read-only while a cache is used) instead of copying it."""
    method = getattr(cache, "method", None)
    return copy.deepcopy(cache, {} if method is None else {id(method): method})


def kv_bytes_per_layer_token(session: Session, element_size: int) -> int:
    """K and V of one token in one layer, at `element_size` bytes a value."""
    return session.num_kv_heads * (session.head_dim + session.value_dim) * element_size


def default_prefill_chunk(session: Session, serving: bool = False, context: int = 0) -> int:
    """Tokens per prefill forward for the model on its device as it is now, for prompts of
    `context` tokens: its activations within a share of the free memory and of the plain cache
    at that length (kvbench.models.budgets); serving, also within what the other streams may
    wait."""
    per_token, free = session.activation_bytes_per_token(), session.free_memory()
    if serving:
        return budgets.serve_prefill_chunk(per_token, free, "cpu" in session.memo_key[2].lower())
    plain = kv_bytes_per_layer_token(session, session.kv_element_size) * session.num_layers
    return budgets.prefill_chunk(per_token, free, context, plain * context)


def plain_kv_bytes(session: Session, cache: Any) -> tuple[int, int]:
    """(K and V of every token the cache's compressed layers have seen at 16 bits, the same at
    the model's dtype, each plus what the library's own layers hold, at 16 bits and as held):
    what the ratios against 16-bit and against the plain cache stand on. Counted from the tokens
    seen, so a method that evicts is credited with what it dropped; in a sliding-window layer a
    quantizer holds, from the window the plain cache would hold (CacheHost.plain_tokens)."""
    seen = cache.plain_tokens()
    library = cache.library_bytes()
    return (kv_bytes_per_layer_token(session, 2) * seen + library * 2 // session.kv_element_size,
            kv_bytes_per_layer_token(session, session.kv_element_size) * seen + library)


def shares_prefill(session: Session, method: Implementation, tokens: int = 0,
                   chunk: int = 0) -> bool:
    """Whether the method's cache can be handed a prompt of `tokens` tokens recorded in plain
    forwards of `chunk` tokens (kvbench.models.shared_prefill), which records the method's layers
    only: not where a layer is not plain full attention (the library's layers would be left
    empty), nor for a method that reads every query of the prompt (it prefills itself, scoring
    in blocks as it goes, rather than have them recorded), nor in several forwards for a method
    whose later chunks read earlier ones compressed."""
    if not (method.shares_prefill and every_layer_plain(session.layer_kinds)):
        return False
    if method.prompt_queries is None:
        return False
    return not chunk or tokens <= chunk or method.shares_chunked_prefill


class ProbeNotTakenBack(ValueError):
    """The cache could not take back the probe it was fed (its policy cannot trim)."""


def prefill(session: Session, cache: Any, ids: list[int], method: Implementation | None,
            probe: list[int] | None = None, refeed: int = 0, chunk: int = 0,
            after_chunk: Callable[[int], None] = lambda fed: None,
            prefilled: PrefilledPrompt | None = None, done: int = 0,
            ) -> tuple[torch.Tensor, float, float]:
    """Feed the prompt `ids` through `cache` (in forwards of `chunk` tokens, each followed by
    after_chunk(tokens fed so far), when chunk is set; with `refeed`, then take its newest
    `refeed` tokens back and feed them again), then the probe (given, else the method's
    reference_probe(ids)) and take it back, then end_prefill: the policies have read the probe's
    queries and compacted. Returns (the prompt's last logits (1, vocab), seconds of the
    forwards, seconds of end_prefill).
    prefilled: `ids` recorded in plain forwards of the same chunks (kvbench.models.shared_prefill),
    ingested in place of the forwards; only for a method that shares_prefill.
    done: the first `done` tokens of `ids` are in `cache` already, fed by these same chunks (a
    multiple of chunk: the server's prefix cache); the forwards start after them."""
    step = chunk or len(ids)
    if done and (done % step or done >= len(ids) or prefilled is not None):
        raise ValueError(f"done ({done}) must be a whole number of chunks of {step} tokens,"
                         f" shorter than the prompt's {len(ids)}, without a shared prefill")
    forward_s = 0.0
    session.begin_prompt(cache, len(ids))
    if prefilled is not None:
        if refeed or method is None or prefilled.chunk != forwards_chunk(chunk, len(ids)) \
                or not shares_prefill(session, method, len(ids), chunk):
            raise ValueError("a shared prefill is the plain forwards of the method's own chunks,"
                             " for a method that shares_prefill")
        ingest(cache, prefilled)
        logits, forward_s = prefilled.logits, prefilled.seconds
        # let the recording go before end_prefill: its views of the prompt would keep every
        # layer's whole keys and values alive through a compaction, beside the kept copies
        prefilled = None
    else:
        for start in range(done, len(ids), step):
            logits, seconds = session.step(ids[start : start + step], cache, last_only=True)
            forward_s += seconds
            after_chunk(min(start + step, len(ids)))
    if refeed:
        session.trim(cache, refeed)
        logits, seconds = session.step(ids[-refeed:], cache, last_only=True)
        forward_s += seconds
    if probe is None and method is not None:
        probe = method.reference_probe(ids)
    if probe:
        forward_s += session.step(probe, cache, last_only=True)[1]
        try:
            session.trim(cache, len(probe))
        except ValueError as exc:
            name = getattr(method, "name", "") or type(method).__name__
            raise ProbeNotTakenBack(f"method {name!r} cannot take the probe back ({exc})") from None
    return logits, forward_s, session.end_prefill(cache)
