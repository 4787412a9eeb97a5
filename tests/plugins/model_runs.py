"""Running methods inside a model or a benchmark for tests, without a suite (plain functions)."""
from __future__ import annotations

from functools import partial

import torch

from kvbench.benchmarks.measure.context import RunContext


def cpu_context(model: str | None = None, repeats: int = 1, *, loaded=None,
                backend: str = "torch", status=None) -> RunContext:
    """A benchmark's context on the CPU, seed 0. Without a model spec (or `loaded`) nothing may
    be loaded; with one, it loads as a run does: kvbench's load_model, or load_mlx_model when a
    session asks for backend "mlx".
    loaded: a model already loaded (e.g. the `bundled` fixture), handed out for its spec instead.
    backend: the case's backend ("torch" or "mlx").
    status: what gets the benchmark's progress text (by default it is dropped)."""
    if loaded is not None:
        model = model or loaded.spec

        def load(spec, device, backend="torch", dtype="float32", **loading):
            return loaded
    elif model is None:
        def load(spec, device, *args, **kwargs):
            return None
    else:
        def load(spec, device, backend="torch", dtype="float32", **loading):
            if backend == "mlx":
                from kvbench.models.mlx_loading import load_mlx_model

                return load_mlx_model(spec)
            from kvbench.models import load_model

            return load_model(spec, device, dtype=dtype)
    extra = {} if status is None else {"status": status}
    return RunContext(device=torch.device("cpu"), seed=0, repeats=repeats, model=model,
                      load_model=load, backend=backend, **extra)


@torch.inference_mode()
def stepped_logits(model, method, ids: torch.Tensor, prefill: int):
    """Feed ids (1, T) to a transformers model: a prefill of `prefill` tokens through a
    KVBenchCache of `method` (a method's settings, run as their torch implementation, or an
    implementation; a plain DynamicCache for None), end_prefill, then one-token decode steps.
    ([the prefill's logits, then each step's], the cache)."""
    from transformers import DynamicCache

    from kvbench.methods import implementation
    from kvbench.methods.settings.base import MethodSettings
    from kvbench.models.hf_cache import KVBenchCache

    if isinstance(method, MethodSettings):
        method = implementation(method)
    cache = (DynamicCache(config=model.config) if method is None
             else KVBenchCache(method, model.config.num_hidden_layers))
    if method is None:
        def forward(x):
            return model(x, past_key_values=cache, use_cache=True)
    else:
        forward = partial(cache.forward, model)
    logits = [forward(ids[:, :prefill]).logits]
    if method is not None:
        cache.end_prefill()
    logits += [forward(ids[:, i:i + 1]).logits for i in range(prefill, ids.shape[1])]
    return logits, cache


def session_logits(session, settings, ids: list[int], prompt: int) -> tuple[torch.Tensor, object]:
    """(the logits at ids[prompt - 1] and at every later position but the last, the cache) of
    the method's cache (its settings, run as their implementation) in a session: ids[:prompt]
    prefilled as a benchmark prefills (kvbench.models.session.prefill), then one token a step."""
    from kvbench.methods import implementation
    from kvbench.models.session import prefill

    method = implementation(settings)
    cache = session.new_cache(method)
    last, _, _ = prefill(session, cache, ids[:prompt], method)
    steps = [last[-1]]
    for token in ids[prompt:-1]:
        steps.append(session.step([token], cache)[0][-1])
    return torch.stack(steps), cache


def staggered_prompts(tokenizer) -> list[list[int]]:
    """Five pydoc prompts of 30 to 66 tokens from different places in the text: rows of
    different lengths for a batched step."""
    from kvbench.data.text import load_text

    ids = tokenizer.encode(load_text("pydoc"))
    return [ids[i * 300 : i * 300 + 30 + 9 * i] for i in range(5)]


def rows_and_alone(session, method, prompts: list[list[int]], token: int
                   ) -> tuple[list, list[torch.Tensor]]:
    """For a batched step's test: a cache of `method` per prompt, prefilled with it, and what
    each prompt's own one-token step of `token` gives after it (its logits (vocab,), from a
    second cache of its own)."""
    caches, alone = [], []
    for prompt in prompts:
        cache, twin = session.new_cache(method), session.new_cache(method)
        session.step(prompt, cache)
        session.step(prompt, twin)
        caches.append(cache)
        alone.append(session.step([token], twin)[0][-1])
    return caches, alone


def logits_by_read(session, make_method, ids: list[int], prefill: int) -> tuple[dict, dict]:
    """Decode ids[prefill:] one token at a time after a prefill of ids[:prefill], once with
    make_method("torch") (the reference read) and once with make_method("auto") (the fused one
    where it applies): ({impl: the steps' logits}, {impl: what ran as the decode attention})."""
    logits, ran = {}, {}
    for impl in ("torch", "auto"):
        method = make_method(impl)
        cache = session.new_cache(method)
        session.step(ids[:prefill], cache)
        logits[impl] = torch.cat([session.step([t], cache)[0] for t in ids[prefill:]])
        ran[impl] = method.impl_log.ran["decode attention"]
    return logits, ran


def methods_on(backend: str, methods: list[tuple[str, dict]]) -> list:
    """The (name, params) methods that have an implementation on `backend`, built for it."""
    from kvbench.methods import has_implementation, implementation
    from kvbench.methods.settings.base import build_method

    built = [build_method(name, params) for name, params in methods]
    return [implementation(s, backend) for s in built if has_implementation(type(s), backend)]


def mlx_session(spec: str):
    """An MLXSession of the model `spec` names; the caller has checked that MLX imports."""
    from kvbench.models.mlx_loading import load_mlx_model
    from kvbench.models.mlx_session import MLXSession

    return MLXSession(load_mlx_model(spec))
