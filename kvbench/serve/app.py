"""The OpenAI-compatible HTTP face of the engine (FastAPI; SSE streams by sse-starlette): the
bodies it accepts are kvbench.serve.bodies', the replies it builds kvbench.serve.reply's.

/v1/completions and /v1/chat/completions (stream or not, `usage` filled in), /v1/models,
/health and /metrics (Prometheus). Two vLLM-style extensions serve benchmarks: `ignore_eos`
(generate exactly max_tokens) and `return_token_ids` (each choice, or chunk, carries its token
ids). A completion may carry a batch of prompts (a choice each), and echo with logprobs scores
the prompt through the method's cache (kvbench.serve.engine: its first `prefill_tokens`, half by
default, prefilled and compressed, the rest fed one at a time and scored), so lm-eval's
loglikelihood requests run unchanged. A chat request is framed with the server's chat options
under its own chat_template_kwargs (kvbench.serve.chat_prompt); with a reasoning parser, its
answer's reasoning comes in `reasoning_content` beside `content`, as vLLM's parsers give it (the
reasoning's tokens counted in usage all the same). A bad request gets an OpenAI-style error object
with the right status before anything is queued; a client that goes away has its request dropped
and its cache freed.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from pydantic import BaseModel, ValidationError
from sse_starlette import EventSourceResponse

from kvbench.models.options import ChatOptions
from kvbench.serve.auth import require_api_key
from kvbench.serve.bodies import MAX_STOPS, ChatBody, CommonBody, CompletionBody, StreamOptions
from kvbench.serve.chat_prompt import chat_prompt, request_options
from kvbench.serve.engine import Engine
from kvbench.serve.errors import APIError
from kvbench.serve.events import Failed, Finished, Scored, Token
from kvbench.serve.metrics import metrics_registry
from kvbench.serve.reply import Reply, whole_batch
from kvbench.serve.request import Request

_DISCONNECT_POLL_S = 0.5


def below_minimum(field: str, least: int, value: int) -> APIError:
    return APIError(400, f"{field} must be at least {least}, got {value}", param=field,
                    code="integer_below_min_value")


def create_app(engine: Engine, model_id: str, method_label: str, max_context: int | None,
               default_max_tokens: int = 16, max_body_bytes: int | None = None,
               chat_options: ChatOptions = ChatOptions(),
               reasoning_parser: str | None = None, api_key: str | None = None) -> FastAPI:
    """The app over `engine`; max_body_bytes: bodies above it get 413 (None: no limit);
    chat_options: what frames every chat request (its own chat_template_kwargs over them);
    reasoning_parser: "think" puts a chat answer's <think>…</think> in reasoning_content;
    api_key: every route but /health asks for it as a bearer token (None: open)."""
    checks = [Depends(require_api_key(api_key))] if api_key is not None else []
    app = FastAPI(title="kvbench serve", docs_url=None, redoc_url=None, dependencies=checks)
    tokenizer = engine.session.tokenizer
    vocab = engine.session.loaded.model.get_input_embeddings().num_embeddings
    app.state.registry = metrics_registry(engine, method_label)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):  # a bug: still an OpenAI error object
        engine.log(f"{request.method} {request.url.path} failed: {exc!r}")
        return APIError(500, f"the server failed: {exc}", kind="server_error").response()

    @app.get("/health")
    async def health():
        answer = {"status": "ok", "model": model_id, "method": method_label,
                  "impl": engine.impl()}
        if engine.prefixes is not None:  # entries, bytes, hits, misses, tokens reused
            answer["prefix_cache"] = engine.prefixes.state()
        return answer

    def model_card() -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "kvbench",
                "max_model_len": max_context}

    def unknown_model(name: str) -> APIError:
        return APIError(404, f"model {name!r} does not exist; this server has {model_id!r}",
                        kind="not_found_error", param="model", code="model_not_found")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_id:
            raise unknown_model(name)
        return model_card()

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(app.state.registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def check_context(prompt: list[int], max_tokens: int, param: str) -> None:
        if max_context is not None and len(prompt) + max_tokens > max_context:
            raise APIError(400, f"the prompt's {len(prompt)} tokens + max_tokens {max_tokens} are"
                           f" above the model's context of {max_context}", param=param,
                           code="context_length_exceeded")

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        body = _parse(await _body(http, max_body_bytes), CompletionBody)
        if body.best_of != 1:
            raise APIError(400, "only best_of = 1 is supported", param="best_of")
        max_tokens = default_max_tokens if body.max_tokens is None else body.max_tokens
        if max_tokens < 0:  # 0: nothing generated (the prompt scored, with echo and logprobs)
            raise below_minimum("max_tokens", 0, max_tokens)
        # off the event loop: a long prompt must not hold up /health and the streams
        prompts = await asyncio.to_thread(_prompt_ids, body.prompt, tokenizer, vocab)
        if body.stream and len(prompts) > 1:
            raise APIError(400, "a stream takes one prompt; send a batch of prompts without"
                           " stream", param="stream")
        for prompt in prompts:
            check_context(prompt, max_tokens, "max_tokens")
        prefilled = [_prefill_tokens(body, len(prompt)) for prompt in prompts]
        echoes = [tokenizer.decode(p) if body.echo else "" for p in prompts]
        return await _serve(http, body, prompts, max_tokens, body.logprobs, chat=False,
                            echoes=echoes, prefilled=prefilled)

    @app.post("/v1/chat/completions")
    async def chat(http: HTTPRequest):
        body = _parse(await _body(http, max_body_bytes), ChatBody)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if body.response_format is not None and body.response_format.type != "text":
            raise APIError(400, f"response_format {body.response_format.type!r} is not supported"
                           " by kvbench serve: only 'text' (OpenAI's default; no structured"
                           " output)", param="response_format")
        field, max_tokens = body.reply_limit()
        if max_tokens is not None and max_tokens < 1:  # OpenAI's chat refuses 0 too
            raise below_minimum(field, 1, max_tokens)
        options = request_options(chat_options, body.chat_template_kwargs)
        try:
            framed = await asyncio.to_thread(
                chat_prompt, [m.as_text() for m in body.messages], tokenizer, options, model_id)
        except ValueError as exc:  # the template refused the messages or the options
            raise APIError(400, str(exc), param="messages") from None
        prompt = framed.ids
        if max_tokens is None and max_context is not None:  # as OpenAI: until the context ends
            if len(prompt) >= max_context:
                raise APIError(400, f"the prompt's {len(prompt)} tokens leave no room for a reply"
                               f" in the model's context of {max_context}", param="messages",
                               code="context_length_exceeded")
            max_tokens = max_context - len(prompt)
        max_tokens = default_max_tokens if max_tokens is None else max_tokens
        check_context(prompt, max_tokens, field)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        return await _serve(http, body, [prompt], max_tokens, logprobs, chat=True,
                            opened=framed.reasoning_opened)

    async def _serve(http: HTTPRequest, body: CommonBody, prompts: list[list[int]],
                     max_tokens: int, logprobs: int | None, chat: bool,
                     echoes: list[str] | None = None, prefilled: list[int] | None = None,
                     opened: bool = False):
        """Each prompt served as one engine request; a stream (one prompt) or one response
        with a choice per prompt. opened: a chat prompt ends inside a reasoning block."""
        if body.model is not None and body.model != model_id:
            raise unknown_model(body.model)
        if body.n != 1:
            raise APIError(400, "only n = 1 is supported", param="n")
        if len(body.stops) > MAX_STOPS or not all(body.stops):
            raise APIError(400, f"stop: at most {MAX_STOPS} sequences, none empty", param="stop")
        if any(not 0 <= i < vocab for i in [*body.stop_token_ids, *body.logit_bias]):
            raise APIError(400, "stop_token_ids and logit_bias keys must be token ids within the"
                           " vocabulary", param="logit_bias")
        if any(not -100 <= bias <= 100 for bias in body.logit_bias.values()):
            raise APIError(400, "logit_bias values must be within [-100, 100]",
                           param="logit_bias")
        loop = asyncio.get_running_loop()
        options = body.stream_options or StreamOptions()
        scores = isinstance(body, CompletionBody) and body.scores_prompt
        runs = []
        for i, prompt in enumerate(prompts):
            events: asyncio.Queue = asyncio.Queue()
            request = Request(prompt, max_tokens,
                              lambda event, events=events: loop.call_soon_threadsafe(
                                  events.put_nowait, event),
                              temperature=body.temperature, top_p=body.top_p,
                              presence_penalty=body.presence_penalty,
                              frequency_penalty=body.frequency_penalty,
                              logit_bias=body.logit_bias, logprobs=logprobs,
                              ignore_eos=body.ignore_eos, seed=body.seed,
                              prefill_tokens=prefilled[i] if prefilled else None,
                              score_prompt=scores)
            reply = Reply(tokenizer, chat, model_id, body.return_token_ids, len(prompt),
                          body.stops, set(body.stop_token_ids), echoes[i] if echoes else "",
                          options.continuous_usage_stats, logprobs=logprobs is not None,
                          index=i, reasoning=chat and reasoning_parser is not None,
                          reasoning_opened=opened)
            runs.append((request, reply, events))
        for request, _, _ in runs:
            engine.submit(request)
        try:
            if body.stream:
                return await _stream_response(http, runs[0], options.include_usage)
            ends = []
            for run in runs:
                end = await _whole(http, run)
                if not isinstance(end, Finished):  # the client left, or this prompt failed
                    for request, _, _ in runs:
                        engine.cancel(request)
                    return Response(status_code=499) if end is None else _failure(end)
                ends.append(end)
        except BaseException:
            for request, _, _ in runs:
                engine.cancel(request)
            raise
        return whole_batch([reply for _, reply, _ in runs], ends)

    async def _stream_response(http: HTTPRequest, run, include_usage: bool):
        """The stream once its first event came (a failure before it gets its own status)."""
        request, reply, events = run
        first = await _next_event(http, events)
        if first is None:  # the client left while the request was queued
            engine.cancel(request)
            return Response(status_code=499)
        if isinstance(first, Failed):
            return _failure(first)
        return EventSourceResponse(_stream(engine, request, events, first, reply,
                                           include_usage), sep="\n", ping=15)

    async def _whole(http: HTTPRequest, run) -> Finished | Failed | None:
        """The request's end, its reply filled on the way; None if the client left."""
        request, reply, events = run
        while True:
            event = await _next_event(http, events)
            if event is None or isinstance(event, (Finished, Failed)):
                return event
            if isinstance(event, Scored):
                reply.scored(event)
                continue
            reply.add(event)
            if reply.stopped:
                engine.cancel(request, outcome="stop")
                return reply.finished()

    return app


def _prefill_tokens(body: CompletionBody, prompt_tokens: int) -> int:
    """The prompt tokens prefilled: the request's prefill_tokens, else half of a scored prompt
    (rounded up: the rest is scored through the cache), else all of it."""
    if body.prefill_tokens is None:
        return (prompt_tokens + 1) // 2 if body.scores_prompt else prompt_tokens
    if body.prefill_tokens > prompt_tokens:
        raise APIError(400, f"prefill_tokens {body.prefill_tokens} is above the prompt's"
                       f" {prompt_tokens} tokens", param="prefill_tokens")
    return body.prefill_tokens


def _failure(failed: Failed) -> JSONResponse:
    kind = "server_error" if failed.status >= 500 else "invalid_request_error"
    response = APIError(failed.status, failed.message, kind=kind).response()
    if failed.retry_after_s is not None:
        response.headers["Retry-After"] = str(failed.retry_after_s)
    return response


async def _next_event(http: HTTPRequest, events: asyncio.Queue):
    """The request's next engine event; None when the client disconnected first."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), _DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await http.is_disconnected():
                return None


async def _stream(engine: Engine, request: Request, events: asyncio.Queue, first,
                  reply: Reply, include_usage: bool):
    event = first
    try:
        if reply.echo and not isinstance(event, Scored):  # a scored prompt's echo waits for it
            yield {"data": json.dumps(reply.echo_chunk())}
        while True:
            if isinstance(event, Scored):
                reply.scored(event)
                yield {"data": json.dumps(reply.echo_chunk())}
            elif isinstance(event, Token):
                chunk, carries = reply.chunk(event)
                if carries or not reply.stopped:
                    yield {"data": json.dumps(chunk)}
                if reply.stopped:
                    engine.cancel(request, outcome="stop")
                    event = reply.finished()
                    continue
            elif isinstance(event, Finished):
                yield {"data": json.dumps(reply.last_chunk(event))}
                if include_usage:
                    yield {"data": json.dumps(reply.usage_chunk(event))}
                yield {"data": "[DONE]"}
                return
            else:  # a failure mid-stream (the server stopping, say): the status is sent
                # already, so it is said in the stream, which then ends as any other
                yield {"data": json.dumps({"error": {"message": event.message,
                                                     "type": "server_error", "param": None,
                                                     "code": None}})}
                yield {"data": "[DONE]"}
                return
            event = await events.get()
    finally:  # normal end, or the client went away (the generator is cancelled or closed)
        engine.cancel(request)


async def _body(http: HTTPRequest, limit: int | None) -> bytes:
    """The request's body; 413 as soon as it is known to be above `limit` bytes (by its
    Content-Length, or while it arrives)."""
    if limit is None:
        return await http.body()
    too_big = APIError(413, f"the body is above the server's limit of {limit} bytes"
                       " (kvbench serve --max-body)")
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in http.stream():
        body += chunk
        if len(body) > limit:
            raise too_big
    return bytes(body)


def _parse(raw: bytes, model: type[BaseModel]):
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object")
    data = {key: value for key, value in data.items() if value is not None}  # null: not sent
    try:  # JSON may escape a lone surrogate (\ud800): no tokenizer can take it
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"the body holds a lone surrogate, not Unicode text: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "not supported by kvbench serve (README: the API surface)"
        if first["loc"][:1] == ("prompt",):  # not the union's first member's complaint
            where, message = "prompt", ("a string, a list of strings, a list of token ids or a"
                                        " list of token-id lists")
        raise APIError(400, f"{where}: {message}", param=where or None) from None


def _prompt_ids(prompt: str | list[int] | list[str] | list[list[int]], tokenizer,
                vocab: int) -> list[list[int]]:
    """The request's prompts as token ids: one, or a batch (a list of strings or of token-id
    lists)."""
    if isinstance(prompt, str) or all(isinstance(part, int) for part in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    ids = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    if not ids or not all(ids):
        raise APIError(400, "the prompt is empty", param="prompt")
    if any(not 0 <= i < vocab for p in ids for i in p):
        raise APIError(400, "prompt token ids must be within the vocabulary", param="prompt")
    return ids

