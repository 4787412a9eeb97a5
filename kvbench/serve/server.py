"""`kvbench serve`: load the model, build and calibrate the method, start the engine, run uvicorn
(on loopback unless told otherwise: kvbench.serve.auth) until stopped (SIGINT / SIGTERM: every
request in flight ends first, each stream with an error event and [DONE], and the process exits
0), then stop the engine."""
from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from kvbench.models.options import ChatOptions

# Start-up check's prompt: past the full-precision windows of the shipped defaults (decay's 128),
# so the method's codec encodes and decodes before the first request does.
CHECK_TOKENS = 256


def serve(model: str, method_name: str, method_params: dict[str, Any], host: str, port: int,
          device: str, threads: int | None, kv_budget: int | None, queue_timeout_s: float,
          max_batch: int, calibration: int, log: Callable[[str], None],
          model_dtype: str = "auto", prefill_chunk: int = 0,
          max_body_bytes: int | None = None, prefix_cache: int = 0,
          chat_options: ChatOptions = ChatOptions(), reasoning_parser: str | None = None,
          api_key: str | None = None) -> None:
    """ValueError, before serving, for a method, parameter, device or model spec that cannot
    run, or chat options the model's chat template refuses. chat_options: what frames every
    chat request; reasoning_parser: "think" (a chat answer's <think>…</think> in
    reasoning_content); api_key: the bearer token every route but /health asks for (None:
    none asked; kvbench.serve.auth.check_access says which binds need one)."""
    import torch
    import uvicorn

    from kvbench.backends.torch_backend import resolve_device
    from kvbench.data.text import text_tokens
    from kvbench.memo import Memo
    from kvbench.methods import build_method, implementation
    from kvbench.models import load_model
    from kvbench.models.session import TorchSession
    from kvbench.serve.app import create_app
    from kvbench.serve.chat_prompt import chat_prompt
    from kvbench.serve.engine import Engine

    # a bad method or an absent device fails before the load
    method = implementation(build_method(method_name, method_params))
    torch_device = resolve_device(device)
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model, torch_device, log=log, dtype=model_dtype)
    session = TorchSession(loaded, torch_device)
    # options the template refuses fail here, not on every request
    chat_prompt([{"role": "user", "content": "?"}], loaded.tokenizer, chat_options, model)
    text = text_tokens(Memo(), session, "pydoc")
    if calibration:  # methods that set themselves from statistics; free for those that do not
        session.calibrate(method, text[:calibration])
    engine = Engine(session, method, kv_budget=kv_budget, queue_timeout_s=queue_timeout_s,
                    max_batch=max_batch, prefill_chunk=prefill_chunk,
                    prefix_cache=prefix_cache, log=log)
    label = method_name if not method_params else f"{method_name}{method_params}"
    try:
        engine.start(check=text[:min(CHECK_TOKENS, (loaded.max_context or CHECK_TOKENS + 1) - 1)])
    except Exception as exc:  # noqa: BLE001 - whatever the method raises, said at start-up
        raise ValueError(f"--method {label} cannot run on {model}: {exc}") from None
    app = create_app(engine, model, label, loaded.max_context, max_body_bytes=max_body_bytes,
                     chat_options=chat_options, reasoning_parser=reasoning_parser,
                     api_key=api_key)
    dtype = str(loaded.dtype).removeprefix("torch.")  # auto's resolved
    log(f"serving on http://{host}:{port} (model {model} in {dtype}, method {label}, device"
        f" {torch_device}, API key {'required' if api_key else 'none'},"
        f" KV budget {kv_budget or 'none'}, prefill chunk {engine.prefill_chunk}, prefix cache"
        f" {prefix_cache or 'off'}, reasoning parser {reasoning_parser or 'none'})")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    try:
        serve_until_signalled(server, engine)
    finally:
        engine.stop()
    if not server.started:
        raise ValueError(f"could not serve on {host}:{port} (uvicorn's error above)")


def serve_until_signalled(server, engine) -> None:
    """Run the uvicorn `server` on a thread of its own until SIGINT or SIGTERM, which first has
    the engine end every request (503; a stream says it in an error event, then [DONE]) and
    then stops the server once those replies are sent; a second signal stops it at once.
    Returns normally (the process exits 0): uvicorn on the main thread re-raises the signal
    once it has shut down, and the process died of it (-15), every stream cut short."""
    def stop(signum, frame) -> None:
        if server.should_exit:
            server.force_exit = True
        engine.request_stop()
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=server.run, name="kvbench-http")
    thread.start()
    try:
        while thread.is_alive():  # a join with a timeout lets the signal handler run
            thread.join(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
