"""The OpenAI-compatible HTTP face of the engine (FastAPI; SSE streams by sse-starlette): the
bodies it accepts are kvbench.serve.bodies', the replies it builds kvbench.serve.reply's.

/v1/completions and /v1/chat/completions (stream or not, `usage` filled in), /v1/models,
/health and /metrics (Prometheus). Two vLLM-style extensions serve benchmarks: `ignore_eos`
(generate exactly max_tokens) and `return_token_ids` (each choice, or chunk, carries its token
ids). A bad request gets an OpenAI-style error object with the right status before anything is
queued; a client that goes away has its request dropped and its cache freed.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ValidationError
from sse_starlette import EventSourceResponse

from kvbench.serve.bodies import MAX_STOPS, ChatBody, CommonBody, CompletionBody, StreamOptions
from kvbench.serve.engine import Engine, Failed, Finished, Request, Token
from kvbench.serve.reply import Reply

_DISCONNECT_POLL_S = 0.5


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                       "param": self.param, "code": self.status}},
                            status_code=self.status)


def create_app(engine: Engine, model_id: str, method_label: str, max_context: int | None,
               default_max_tokens: int = 16,
               max_body_bytes: int | None = None) -> FastAPI:
    """The app over `engine`; max_body_bytes: bodies above it get 413 (None: no limit)."""
    app = FastAPI(title="kvbench serve", docs_url=None, redoc_url=None)
    tokenizer = engine.session.tokenizer
    vocab = engine.session.loaded.model.get_input_embeddings().num_embeddings
    app.state.registry = _registry(engine, method_label)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):  # a bug: still an OpenAI error object
        engine.log(f"{request.method} {request.url.path} failed: {exc!r}")
        return APIError(500, f"the server failed: {exc}", kind="server_error").response()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id, "method": method_label,
                "impl": engine.impl()}

    def model_card() -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "kvbench",
                "max_model_len": max_context}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_id:
            raise APIError(404, f"model {name!r} does not exist; this server has {model_id!r}",
                           kind="not_found_error", param="model")
        return model_card()

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(app.state.registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        body = _parse(await _body(http, max_body_bytes), CompletionBody)
        if body.best_of != 1:
            raise APIError(400, "only best_of = 1 is supported", param="best_of")
        if body.echo and body.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported (the prompt's logprobs are"
                           " not computed)", param="echo")
        # off the event loop: a long prompt must not hold up /health and the streams
        prompt = await asyncio.to_thread(_prompt_ids, body.prompt, tokenizer, vocab)
        echo = tokenizer.decode(prompt) if body.echo else ""
        return await _serve(http, body, prompt, body.max_tokens, body.logprobs, chat=False,
                            echo=echo)

    @app.post("/v1/chat/completions")
    async def chat(http: HTTPRequest):
        body = _parse(await _body(http, max_body_bytes), ChatBody)
        prompt = await asyncio.to_thread(_chat_ids, [m.as_text() for m in body.messages],
                                         tokenizer)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is None and max_context is not None:  # as OpenAI: until the context ends
            max_tokens = max_context - len(prompt)
        return await _serve(http, body, prompt, max_tokens, logprobs, chat=True)

    async def _serve(http: HTTPRequest, body: CommonBody, prompt: list[int], max_tokens: int | None,
                     logprobs: int | None, chat: bool, echo: str = ""):
        if body.model is not None and body.model != model_id:
            raise APIError(404, f"model {body.model!r} does not exist; this server has"
                           f" {model_id!r}", kind="not_found_error", param="model")
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
        max_tokens = default_max_tokens if max_tokens is None else max_tokens
        if max_tokens <= 0:
            raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}",
                           param="max_tokens")
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        if max_context is not None and len(prompt) + max_tokens > max_context:
            raise APIError(400, f"the prompt's {len(prompt)} tokens + max_tokens {max_tokens} are"
                           f" above the model's context of {max_context}", param="max_tokens")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        request = Request(prompt, max_tokens,
                          lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
                          temperature=body.temperature, top_p=body.top_p,
                          presence_penalty=body.presence_penalty,
                          frequency_penalty=body.frequency_penalty, logit_bias=body.logit_bias,
                          logprobs=logprobs, ignore_eos=body.ignore_eos, seed=body.seed)
        options = body.stream_options or StreamOptions()
        reply = Reply(tokenizer, chat, model_id, body.return_token_ids, len(prompt),
                       body.stops, set(body.stop_token_ids), echo,
                       options.continuous_usage_stats)
        engine.submit(request)
        try:
            first = await _next_event(http, events)
        except BaseException:
            engine.cancel(request)
            raise
        if first is None:  # the client left while the request was queued
            engine.cancel(request)
            return Response(status_code=499)
        if isinstance(first, Failed):
            return _failure(first)
        if body.stream:
            return EventSourceResponse(_stream(engine, request, events, first, reply,
                                               options.include_usage), sep="\n", ping=15)
        event = first
        while not isinstance(event, (Finished, Failed)):
            reply.add(event)
            if reply.stopped:
                engine.cancel(request, outcome="stop")
                event = reply.finished()
                break
            event = await _next_event(http, events)
            if event is None:
                engine.cancel(request)
                return Response(status_code=499)
        if isinstance(event, Failed):
            return _failure(event)
        return reply.whole(event)

    return app


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
        if reply.echo:
            yield {"data": json.dumps(reply.echo_chunk())}
        while True:
            if isinstance(event, Token):
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
            else:  # a failure mid-stream: the status is sent already, say it in the stream
                yield {"data": json.dumps({"error": {"message": event.message,
                                                     "type": "server_error",
                                                     "code": event.status}})}
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
        raise APIError(400, f"{where}: {message}", param=where or None) from None


def _prompt_ids(prompt: str | list[int] | list[str], tokenizer, vocab: int) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if all(isinstance(part, int) for part in prompt):
        if any(not 0 <= i < vocab for i in prompt):
            raise APIError(400, "prompt token ids must be within the vocabulary", param="prompt")
        return list(prompt)
    if len(prompt) == 1:
        return tokenizer.encode(prompt[0])
    raise APIError(400, "one prompt per request (n = 1, no batches of prompts)", param="prompt")


def _chat_ids(messages: list[dict], tokenizer) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    # a model without a chat template (the tiny test models): role-tagged lines
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return tokenizer.encode(text)


def _registry(engine: Engine, method_label: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
    registry.register(_EngineCollector(engine, method_label))
    return registry


class _EngineCollector:
    def __init__(self, engine: Engine, method_label: str):
        self.engine, self.method = engine, method_label

    def collect(self):
        state, totals = self.engine.state(), self.engine.totals
        gauges = {
            "kvbench_requests_active": ("requests being decoded", state["active"]),
            "kvbench_requests_queued": ("requests waiting for room", state["queued"]),
            "kvbench_live_caches": ("request caches not yet freed", state["live_caches"]),
            "kvbench_kv_reserved_bytes": ("KV bytes reserved by active requests (budget)",
                                          state["kv_reserved_bytes"]),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, key in (
            ("kvbench_kv_bytes", "KV bytes the active caches hold, as the method accounts them",
             "kv_accounted_bytes"),
            ("kvbench_kv_measured_bytes", "bytes of the arrays the active caches hold",
             "kv_measured_bytes"),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["method"])
            gauge.add_metric([self.method], state[key])
            yield gauge
        budget = self.engine.kv_budget
        yield GaugeMetricFamily("kvbench_kv_budget_bytes", "the --kv-budget (0: none)",
                                value=budget or 0)
        for name, doc, value in (
            ("kvbench_prompt_tokens", "prompt tokens prefilled", totals.prompt_tokens),
            ("kvbench_generated_tokens", "tokens generated", totals.generated_tokens),
            ("kvbench_decode_steps", "batched decode forwards", totals.decode_steps),
            ("kvbench_decode_rows", "requests summed over decode forwards", totals.decode_rows),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        finished = CounterMetricFamily("kvbench_requests_finished",
                                       "requests that ended, by outcome", labels=["outcome"])
        for outcome, count in sorted(totals.finished.items()):
            finished.add_metric([outcome], count)
        yield finished
