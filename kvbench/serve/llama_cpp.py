"""`python -m kvbench.serve.llama_cpp`: llama-cpp-python's OpenAI server (`python -m
llama_cpp.server`, the same arguments but --config_file) with one addition, so that the
perplexity benchmark can score a window of tokens through llama.cpp's KV cache: a POST
/v1/completions whose prompt is a list of token ids, with echo, answers with the logprob of every
prompt token given the ones before it.

llama-cpp-python 0.3's own server cannot. Its prompt is text only, tokenized again (a window cut
from a longer text can come back as other tokens); and its echoed logprob of a prompt token is
read from the logits at that token's own position, not the one before, unless the prompt starts
with a BOS token (abetlen/llama-cpp-python issue 1983; SmolLM2's GGUF adds none). On the bundled
model, "The capital of France is" echoed " of" at -10.6 there (its logprob after " of"); here
-0.31, after "The capital".

The addition runs the server's own model (its Llama, loaded with every argument given here:
--type_k, --type_v, --flash_attn, --n_batch, ...) under the server's lock: Llama.eval of the ids
from an empty cache, n_batch tokens per llama_decode, each batch's K and V written to the cache
before attention reads them, then a log-softmax of the logits kept for every position
(--logits_all, the server's default, must stay true). Every other request reaches llama-cpp-
python's app unchanged, byte for byte.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from functools import partial
from typing import Any

from kvbench.config.extras import lacks

MAX_TOP = 20  # logprobs asked per position, at most


def main(argv: list[str] | None = None) -> None:
    missing = lacks("llama-cpp", "python -m kvbench.serve.llama_cpp")
    if missing:
        raise SystemExit(missing)
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings
    from pydantic import ValidationError

    parser = argparse.ArgumentParser(
        prog="python -m kvbench.serve.llama_cpp",
        description="llama-cpp-python's server, which also scores prompts of token ids"
                    " (echoed logprobs); the arguments are llama_cpp.server's")
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    try:
        server_settings = parse_model_from_args(ServerSettings, args)
        model_settings = parse_model_from_args(ModelSettings, args)
    except ValidationError as exc:
        parser.error(str(exc))
    if not model_settings.logits_all:
        parser.error("--logits_all must stay true: scoring a prompt reads every position's"
                     " logits")
    app = create_app(server_settings=server_settings, model_settings=[model_settings])
    uvicorn.run(TokenIdScoring(app), host=server_settings.host, port=server_settings.port)


class TokenIdScoring:
    """An ASGI app in front of llama-cpp-python's: it answers a completion whose prompt is token
    ids itself, and hands every other request to `app` as it came."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"].rstrip("/") == "/v1/completions"):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if not (isinstance(request, dict) and is_token_ids(request.get("prompt"))):
            await self.app(scope, _replay(body, receive), send)
            return
        response = await _answer(request)
        await response(scope, receive, send)


def is_token_ids(prompt: Any) -> bool:
    return (isinstance(prompt, list) and bool(prompt)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt))


async def _read_body(receive: Any) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


def _replay(body: bytes, receive: Any) -> Any:
    """A `receive` that hands the body already read once, then whatever comes next."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def refusal(request: dict) -> str | None:
    """Why a token-id completion cannot be scored here; None when it can."""
    if request.get("stream"):
        return "stream: a prompt of token ids is scored here, answered whole: stream false"
    if request.get("echo") is not True:
        return ("echo: a prompt of token ids is only scored here (echo true, logprobs);"
                " send text to generate")
    if not isinstance(request.get("logprobs"), int) or request["logprobs"] < 0:
        return "logprobs: ask for the prompt's logprobs (an integer >= 0)"
    if request.get("max_tokens", 16) not in (0, 1):
        return "max_tokens: 0 or 1 when a prompt of token ids is scored"
    return None


async def _answer(request: dict) -> Any:
    from anyio import to_thread
    from llama_cpp.server.app import get_llama_proxy
    from starlette.responses import JSONResponse

    problem = refusal(request)
    if problem is None:
        async with contextlib.asynccontextmanager(get_llama_proxy)() as proxy:
            if proxy is None:
                return _error(503, "the model is not loaded")
            llama = proxy(request.get("model"))
            try:
                return JSONResponse(await to_thread.run_sync(
                    partial(score, llama, request["prompt"], request.get("max_tokens", 16),
                            min(request["logprobs"], MAX_TOP))))
            except ValueError as exc:
                problem = str(exc)
    return _error(400, problem)


def _error(status: int, message: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}},
                        status_code=status)


def score(llama: Any, ids: list[int], generate: int, top: int) -> dict[str, Any]:
    """The completion answer for prompt `ids` (echoed) and `generate` (0 or 1) greedy tokens:
    each token's logprob given the ones before it (None for the first), and the `top` best
    candidates there. ValueError for ids the model cannot take."""
    import numpy as np
    from llama_cpp import Llama

    n, vocab = len(ids), llama.n_vocab()
    if n + generate > llama.n_ctx():
        raise ValueError(f"prompt: {n} tokens (+ {generate}) are above n_ctx {llama.n_ctx()}")
    if not all(0 <= i < vocab for i in ids):
        raise ValueError(f"prompt: token ids must be in 0..{vocab - 1}")
    llama.reset()  # from an empty cache: eval removes every cell past n_tokens
    llama.eval(ids)
    logprobs = Llama.logits_to_logprobs(llama.scores[:n])
    tokens = list(ids)
    if generate:
        tokens.append(int(np.argmax(logprobs[n - 1])))
    rows = np.arange(len(tokens) - 1)  # row i: after token i, the logprobs of token i + 1
    values = [None, *logprobs[rows, tokens[1:]].astype(float).tolist()]

    def piece(token: int) -> str:
        return llama.detokenize([token]).decode("utf-8", errors="replace")

    pieces = [piece(t) for t in tokens]
    tops: list[dict[str, float] | None] = [None]
    if top:
        best = np.argpartition(-logprobs[rows], top - 1, axis=-1)[:, :top]
        tops += [{piece(int(t)): float(logprobs[i, t]) for t in best[i]} for i in rows]
    else:
        tops += [{} for _ in rows]
    offsets = np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist()
    return {
        "object": "text_completion",
        "model": llama.model_path,
        "choices": [{
            "text": "".join(pieces), "index": 0, "finish_reason": "length",
            "logprobs": {"tokens": pieces, "token_logprobs": values, "top_logprobs": tops,
                         "text_offset": offsets},
        }],
        "usage": {"prompt_tokens": n, "completion_tokens": generate,
                  "total_tokens": n + generate},
    }


if __name__ == "__main__":
    main()
