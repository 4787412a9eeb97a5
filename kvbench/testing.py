"""The contract every kvbench method keeps, as checks a method author runs on their own method:

    from kvbench.testing import check_method
    check_method(MySettings(bits=4))                 # its torch implementation, on the CPU
    check_method(MySettings(bits=4), backend="mlx")  # its MLX implementation, if registered

Each check drives the method's layer caches the way a model's attention does (a prompt, the
probe the method asks for, end_prefill, one-token and multi-token decode steps) on fresh random
keys, values and queries, then the whole path once more inside kvbench's tiny random model (no
files, no network). What is checked:

- bytes: accounted bytes are positive and never above the bytes really held; a codec's nbytes
  is exactly the bytes of the tensors it packed; a method without a codec accounts exactly the
  keys, values and per-key bias it hands attention (when it returns no summaries).
- tokens: seen tokens count every token fed; retained tokens and the returned keys agree; a
  policy holding a budget (`holds_budget`) holds it after every decode step, one token or many.
- trim (if declared): the newest tokens fed before end_prefill are taken back, and fed again
  they give the same attention inputs.
- the cache is read: poisoned prompt values change the attention output after end_prefill.
- wrappers hand on what the policy they wrap returns (keys, values, bias, observes_queries), and
  a probe (if declared) changes what is kept.
- devices (torch): no tensor is made without the keys' device: the whole drive runs again with
  meta as the default device (`with torch.device("meta")`), where such a tensor cannot meet the
  CPU inputs in arithmetic or concatenation (torch lets a meta index through gather and
  indexing: those are not caught).
- the model: prefill with the method's probe, end_prefill and decode inside a real attention give
  finite logits and positions that continue from the prompt.

A failed check raises ConformanceError naming the method, the check and what went wrong.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from kvbench.backends import array_backend
from kvbench.methods import MethodSettings, implementation
from kvbench.methods.core.contracts import Implementation
from kvbench.methods.core.wrapped_policy import WrappedPolicy
from kvbench.models.host import LayerHost

KV_HEADS, QUERY_HEADS, HEAD_DIM = 2, 4, 16
PROMPT, PROBE, STEPS, CHUNK, SHARED_CHUNK = 48, 6, 3, 4, 16
POISON = 100.0


class ConformanceError(AssertionError):
    """A method broke the contract; the message says which check and how."""


def check_method(settings: MethodSettings, backend: str = "torch", device: str = "cpu",
                 model: bool = True) -> list[str]:
    """Run every check on the method `settings` configure, as `backend` implements it (see the
    module's docstring); ConformanceError on the first that fails, else the names of the checks
    it passed. `model`: also drive it through the tiny model (needs transformers, or mlx-lm on
    MLX)."""
    label = f"{type(settings).name or type(settings).__name__} {_params(settings)} on {backend}"
    if backend not in ("torch", "mlx"):
        raise ValueError(f"unknown backend {backend!r}; use torch or mlx")
    method = implementation(settings, backend)
    arrays = array_backend(backend, torch.device(device))
    subject = _Subject(method, method.new_layer_cache, arrays,
                       stores_inputs=method.stores_reads)
    drives = _drives(method.supports())
    checks: list[tuple[str, Callable[[], None]]] = [
        (name, lambda drive=drive: drive(subject)) for name, drive in drives]
    if method.key_codec() is not None and backend == "torch":
        checks.append(("codec bytes", lambda: _check_codecs(method, arrays)))
    if backend == "torch" and arrays.device.type == "cpu":
        checks.append(("tensors on the keys' device",
                       lambda: _check_no_default_device(subject, drives)))
    if model:
        checks.append(("inside the tiny model", lambda: _check_model(method, backend, device)))
        # a method that reads every query of the prompt prefills itself (models.session)
        if method.shares_prefill and method.prompt_queries is not None:
            checks.append(("shared prefill",
                           lambda: _check_shared_prefill(method, backend, device, arrays)))
    for name, check in checks:
        try:
            check()
        except ConformanceError as exc:
            raise ConformanceError(f"{label}: {name}: {exc}") from None
        except Exception as exc:
            raise ConformanceError(
                f"{label}: {name}: raised {type(exc).__name__}: {exc}") from exc
    return [name for name, _ in checks]


def _drives(capabilities) -> list[tuple[str, Callable[[Any], None]]]:
    """The checks that drive layer caches, those the capabilities declare included."""
    drives = [("bytes and tokens", lambda subject: _check_drive(subject, chunk=1)),
              ("the cache is read", _check_reads_cache)]
    if capabilities.decode_chunk:
        drives.append(("multi-token decode", lambda subject: _check_drive(subject, CHUNK)))
    if capabilities.trim:
        drives.append(("trim", _check_trim))
    if capabilities.probes:
        drives.append(("probes are read", _check_probe))
    return drives


def _params(settings: MethodSettings) -> str:
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.init}
    return ", ".join(f"{k}={v!r}" for k, v in fields.items()) or "(defaults)"


def _fail(message: str) -> None:
    raise ConformanceError(message)


def _inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys, values (1, KV_HEADS, n, HEAD_DIM) and queries (1, QUERY_HEADS, n, HEAD_DIM) with a
    few outlier channels, float32 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=g, device="cpu")
    keys[..., :2] *= 6
    values = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=g, device="cpu")
    queries = torch.randn(1, QUERY_HEADS, n, HEAD_DIM, generator=g, device="cpu") * 2
    return keys, values, queries


# ---- one layer, driven as attention drives it --------------------------------------------------

class _Layer(LayerHost):
    """One policy hosted as a model's layer (kvbench.models.host) and a reference attention
    over what it reads, step by step."""

    def __init__(self, policy, arrays, stores_inputs: bool):
        super().__init__(policy, 0)
        self.arrays = arrays
        self.stores_inputs = stores_inputs  # no codec: what attention reads is what it stores
        self.fed = 0

    def step(self, keys, values, queries) -> torch.Tensor:
        """Append one step, check what attention is handed, attend, show the queries; the
        attention output (1, QUERY_HEADS, n, HEAD_DIM) as float32."""
        from kvbench.models.attention import biased_attention

        put, get = self.arrays.from_torch, self.get
        read = self.append(put(keys), put(values))
        self.fed += keys.shape[-2]
        self.check_state(read.keys, read.values, read.bias)
        bias = None if read.bias is None else get(read.bias)
        out, sparse = biased_attention(queries, get(read.keys), get(read.values), None, bias,
                                       HEAD_DIM ** -0.5, read.skip_below)
        read.attended(put(queries), sparse)
        return out

    def get(self, array) -> torch.Tensor:
        """An array the policy returned, as a float32 CPU tensor."""
        return self.arrays.to_torch(array).float()

    def check_state(self, keys, values, bias) -> None:
        """What append() does not check: seen tokens, bytes, what a wrapper hands on."""
        policy = self.policy
        if policy.seen_tokens != self.fed:
            _fail(f"seen_tokens is {policy.seen_tokens} after {self.fed} tokens were fed")
        accounted, measured = policy.retained_bytes, policy.measured_bytes()
        if not 0 < accounted <= measured:
            _fail(f"accounted bytes {accounted} must be positive and at most the {measured}"
                  " bytes it holds")
        per_key_bias = bias is None or len(bias.shape) == 3  # a per-query mask is not stored
        if self.stores_inputs and per_key_bias and policy.summary_slots == 0:
            returned = sum(self.arrays.nbytes(a) for a in (keys, values, bias) if a is not None)
            if accounted != returned:
                _fail(f"accounts {accounted} bytes but hands attention {returned} bytes of"
                      " keys, values and bias")
        if isinstance(policy, WrappedPolicy):
            inner = policy.inner.attention_inputs()
            for name, mine, theirs in zip(("keys", "values", "bias"), (keys, values, bias), inner):
                if (mine is None) != (theirs is None) or (
                        mine is not None and not torch.equal(self.get(mine), self.get(theirs))):
                    _fail(f"the wrapper returns other {name} than the policy it wraps")
            if policy.observes_queries != policy.inner.observes_queries:
                _fail("the wrapper does not pass on whether its policy observes queries")

    def take_back(self, n: int) -> None:
        taken = self.trim(n)
        self.fed -= taken
        if taken != n:
            _fail(f"trim({n}) took back {taken} tokens fed before end_prefill; the method"
                  " declares trim or asks for a probe")

    def inputs(self) -> list[torch.Tensor | None]:
        """What attention would read now: keys, values, bias, as float32 torch tensors."""
        return [None if a is None else self.get(a) for a in self.policy.attention_inputs()]

    def end_prefill(self) -> None:
        self.policy.end_prefill()


@dataclasses.dataclass
class _Subject:
    """What the checks drive: the method, its cache factory on the backend, the arrays."""

    method: Implementation
    build: Callable[[int], Any]
    arrays: Any
    stores_inputs: bool  # no codec: what attention reads is what the cache stores

    @property
    def own_probe(self) -> bool:
        """Whether the method asks for a probe after the prompt (e.g. the prompt again)."""
        return bool(self.method.reference_probe(list(range(PROMPT))))


def _prefill(subject: _Subject, seed: int, probe_seed: int | None = None,
             poison: float = 0.0) -> _Layer:
    """A layer fed the prompt (its values shifted by `poison`), a probe taken back (when
    probe_seed is given or the method asks for one), and end_prefill."""
    layer = _Layer(subject.build(1), subject.arrays, subject.stores_inputs)
    keys, values, queries = _inputs(PROMPT, seed)
    layer.step(keys, values + poison, queries)
    if probe_seed is None and subject.own_probe:
        probe_seed = seed + 1
    if probe_seed is not None:
        layer.step(*_inputs(PROBE, probe_seed))
        layer.take_back(PROBE)
    layer.end_prefill()
    return layer


def _check_drive(subject: _Subject, chunk: int) -> None:
    """Prompt (and the method's own probe), end_prefill, decode in steps of `chunk` tokens:
    seen, retained and bytes agree at every step; a budget-holding policy holds it."""
    layer = _prefill(subject, seed=1)
    policy = layer.policy
    kept = policy.retained_tokens
    if kept > PROMPT:
        _fail(f"retains {kept} tokens after a prompt of {PROMPT}")
    inner = policy.inner if isinstance(policy, WrappedPolicy) else policy
    holds = getattr(inner, "holds_budget", False)
    for i in range(STEPS):
        layer.step(*_inputs(chunk, seed=10 + i))
        if holds and policy.retained_tokens != kept:
            _fail(f"holds a budget of {kept} tokens, but retains {policy.retained_tokens} after"
                  f" a {chunk}-token decode step")
        if not holds and policy.retained_tokens > kept + (i + 1) * chunk:
            _fail(f"retains {policy.retained_tokens} tokens, more than it was fed")


def _check_reads_cache(subject: _Subject) -> None:
    """Shifting every prompt value by POISON must move the decode step's attention output."""
    step = _inputs(1, seed=20)
    clean = _prefill(subject, seed=2).step(*step)
    poisoned = _prefill(subject, seed=2, poison=POISON).step(*step)
    moved = float((poisoned - clean).abs().mean())
    if not moved > 1.0:
        _fail(f"prompt values shifted by {POISON:g} moved the decode output by {moved:.3g} on"
              " average: attention does not read what the cache holds")


def _check_trim(subject: _Subject) -> None:
    """Tokens fed after the prompt and taken back, then fed again, give the same inputs."""
    layer = _Layer(subject.build(1), subject.arrays, subject.stores_inputs)
    layer.step(*_inputs(PROMPT, seed=3))
    extra = _inputs(PROBE, seed=4)
    layer.step(*extra)
    first = layer.inputs()
    layer.take_back(PROBE)
    if layer.policy.seen_tokens != PROMPT:
        _fail(f"seen_tokens is {layer.policy.seen_tokens} after taking back to {PROMPT}")
    layer.step(*extra)
    again = layer.inputs()
    for name, a, b in zip(("keys", "values", "bias"), first, again):
        if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
            _fail(f"{name} differ after the same tokens were taken back and fed again")


def _check_probe(subject: _Subject) -> None:
    """A method that declares probes keeps something else after another probe."""
    one = _prefill(subject, seed=5, probe_seed=30).inputs()[:2]
    other = _prefill(subject, seed=5, probe_seed=31).inputs()[:2]
    if all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(one, other)):
        _fail("two different probes fed and taken back before end_prefill left the same cache")


def _check_codecs(method: Implementation, arrays) -> None:
    """nbytes is exactly the packed tensors' bytes; decode gives back the shape and dtype."""
    keys, values, _ = _inputs(PROMPT, seed=6)
    for what, codec, x in (("key", method.key_codec(), keys), ("value", method.value_codec(), values)):
        block = codec.token_block
        x = arrays.from_torch(x[..., : PROMPT - PROMPT % block, :])
        packed = codec.encode(x)
        counted, held = codec.nbytes(packed), arrays.nbytes(*packed.tensors.values())
        if counted != held:
            _fail(f"the {what} codec counts {counted} bytes but packed {held}")
        out = codec.decode(packed)
        if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
            _fail(f"the {what} codec decodes {tuple(x.shape)} {x.dtype} to {tuple(out.shape)}"
                  f" {out.dtype}")


def _check_no_default_device(subject: _Subject, drives) -> None:
    """The drives again with the default device set to meta: a tensor made without device=
    while the cache works lands there and cannot meet the CPU keys. Caches are built on the
    CPU (constants made at construction are moved where they are used)."""
    build = subject.build

    def build_on_cpu(layer_idx: int):
        with torch.device("cpu"):
            return build(layer_idx)

    on_cpu = dataclasses.replace(subject, build=build_on_cpu)
    try:
        with torch.device("meta"):
            for _, drive in drives:
                drive(on_cpu)
    except ConformanceError:
        raise
    except Exception as exc:
        raise ConformanceError(
            f"raised {type(exc).__name__}: {exc}. The drive ran with meta as the default device:"
            " a tensor the cache makes without device= lands there. Make each on the keys'"
            " device (torch.zeros(..., device=keys.device), or x.new_zeros(...))") from exc


# ---- inside a model ----------------------------------------------------------------------------

def _check_model(method: Implementation, backend: str, device: str) -> None:
    """Prefill (with the method's probe), end_prefill and decode through kvbench's tiny model:
    finite logits, positions continuing from the prompt."""
    from kvbench.models.session import prefill

    session = _tiny_session(backend, device)
    prompt = [(7 * i) % 200 + 4 for i in range(PROMPT)]
    session.calibrate(method, [(11 * i) % 200 + 4 for i in range(64)])
    cache = session.new_cache(method)
    logits, _, _ = prefill(session, cache, prompt, method)
    steps = [[int(logits[-1].argmax())]]
    if method.supports().decode_chunk:
        steps.append([5, 6, 7, 8])
    for ids in steps:
        logits, _ = session.step(ids, cache)
        if not torch.isfinite(logits).all():
            _fail(f"non-finite logits after a {len(ids)}-token decode step")
    fed = PROMPT + sum(map(len, steps))
    seen = {policy.seen_tokens for policy in cache.policies}
    if seen != {fed}:
        _fail(f"layers report {sorted(seen)} tokens seen after {fed} were fed")


def _check_shared_prefill(method: Implementation, backend: str, device: str, arrays) -> None:
    """A method that declares shares_prefill, prefilled by itself, gives the plain forward's
    logits and, after its probe and end_prefill, the attention inputs the recorded plain forward
    ingested gives, at every layer and after a decode step, bit for bit; in forwards of
    SHARED_CHUNK tokens too where it declares shares_chunked_prefill."""
    session = _tiny_session(backend, device)
    session.calibrate(method, [(11 * i) % 200 + 4 for i in range(64)])
    for chunk in (0, SHARED_CHUNK) if method.shares_chunked_prefill else (0,):
        _check_shared_prefill_in(session, method, arrays, chunk)


def _check_shared_prefill_in(session, method: Implementation, arrays, chunk: int) -> None:
    from kvbench.models.session import prefill
    from kvbench.models.shared_prefill import prefill_plain

    fed = f" in forwards of {chunk} tokens" if chunk else ""
    prompt = [(7 * i) % 200 + 4 for i in range(PROMPT)]
    recorded = prefill_plain(session, prompt, chunk, queries=method.prompt_queries)
    caches = []
    for prefilled in (None, recorded):
        torch.manual_seed(0)  # methods that draw (rotations) draw alike for both caches
        cache = session.new_cache(method)
        logits, _, _ = prefill(session, cache, prompt, method, chunk=chunk, prefilled=prefilled)
        caches.append((cache, logits))
    (own, own_logits), (shared, _) = caches
    if not torch.equal(own_logits, recorded.logits):
        _fail(f"its own prefill{fed} gives other logits than the plain forward: the prompt's"
              " keys, values or attention are not the plain model's")
    for step in range(2):
        for layer, (mine, theirs) in enumerate(zip(own.policies, shared.policies)):
            for name, a, b in zip(("keys", "values", "bias"), mine.attention_inputs(),
                                  theirs.attention_inputs()):
                if (a is None) != (b is None) or (
                        a is not None and not torch.equal(arrays.to_torch(a), arrays.to_torch(b))):
                    when = "a decode step" if step else "prefill"
                    _fail(f"layer {layer}: its {name} after {when}"
                          f" differ between its own prefill{fed} and the shared one")
        if not step:
            token = [int(own_logits[-1].argmax())]
            if not torch.equal(session.step(token, own)[0], session.step(token, shared)[0]):
                _fail(f"a decode step after its own prefill{fed} and the shared one differ")


def _tiny_session(backend: str, device: str):
    if backend == "mlx":
        from kvbench.models.mlx_loading import load_mlx_model
        from kvbench.models.mlx_session import MLXSession

        return MLXSession(load_mlx_model("tiny:llama"))
    from kvbench.models.loading import load_model
    from kvbench.models.session import TorchSession

    return TorchSession(load_model("tiny:llama", device), torch.device(device))


__all__ = ["ConformanceError", "check_method"]
