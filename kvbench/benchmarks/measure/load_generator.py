"""The stress benchmark's load loop, and its records counted, scored and compared.

One level: `users` asyncio tasks started together, each sending its requests one after another
to an OpenAI-compatible server on loopback (streamed, greedy), over one httpx.AsyncClient. Every
request is bounded (`request_timeout_s`) and so is the level (`level_timeout_s`: what is still
running is cancelled, what was not sent is not sent, and both count as failed). A request fails
on a non-200 status, an exception, a timeout, or a stream that ends with no token; failures are
counted and never enter the latencies.

Times are time.perf_counter() seconds. A token chunk is a stream chunk that carries text or token
ids; its arrival time is when its `data:` line was read.

A task sample's response is scored as NVIDIA RULER scores it (kvbench.benchmarks.measure.
ruler_scoring), its reasoning (<think>…</think>) left out (kvbench.models.chat.split_reasoning).
A level's figures, goodput among them: kvbench.benchmarks.measure.load_figures.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from kvbench.benchmarks.measure.ruler_scoring import postprocess, sample_score
from kvbench.benchmarks.specs.server_target import check_server_url
from kvbench.models.chat import split_reasoning

ERROR_CHARS = 300  # of a failed response's body kept in its error


@dataclass
class RequestRecord:
    """One request of a level: who sent it, what came back and when."""

    user: int
    turn: int  # the user's j-th request
    prompt: int  # index into the level's prompts
    t_sent: float | None = None
    t_first: float | None = None  # the first token chunk
    t_end: float | None = None  # the response finished (or failed)
    status: int | None = None
    error: str = ""
    chunk_times: list[float] = field(default_factory=list)  # each token chunk's arrival
    text: str = ""
    server_ids: list[int] | None = None  # token ids the server sent (kvbench's token_ids)
    usage_tokens: int | None = None  # usage.completion_tokens
    # the candidates the server listed at each output token (text -> logprob; None: no logprobs)
    tops: list[dict[str, float]] | None = None
    finish_reason: str | None = None
    # set by count_tokens: the output token count and the ids compared with the reference
    output_tokens: int = 0
    ids: list[int] = field(default_factory=list)
    count_source: str = ""
    ids_source: str = ""
    # set by score_records for a task sample's successful response: RULER's score, 0-100
    score: float | None = None

    @property
    def ok(self) -> bool:
        return not self.error and self.status == 200 and self.t_first is not None

    @property
    def sent(self) -> bool:
        return self.t_sent is not None


@dataclass(frozen=True)
class Task:
    """What makes a prompt a RULER task sample: what its response is scored against and how
    much it may say."""

    name: str
    references: tuple[str, ...]
    metric: str  # "all" (string_match_all) or "part" (string_match_part)
    tokens_to_generate: int
    message: str  # the sample's text (context and question), as one chat user message
    reasoning_opened: bool = False  # its prompt's template opens a reasoning block


@dataclass
class Prompt:
    index: int
    text: str  # what a server that is not sent token ids gets (completions)
    ids: list[int]
    task: Task | None = None  # None: free text, its answer only compared with the single-user one


@dataclass
class Level:
    """A finished level: its records (every planned request, sent or not), the long-prompt
    user's request (None without one) and whether its time ran out."""

    users: int
    records: list[RequestRecord]
    timed_out: bool = False
    long: RequestRecord | None = None


# ---- the HTTP side -----------------------------------------------------------------------------

RequestBody = Callable[[Prompt], dict[str, Any]]


def run_level(url: str, path: str, prompts: list[Prompt], users: int, requests_per_user: int,
              body: RequestBody, request_timeout_s: float, level_timeout_s: float,
              long: tuple[Prompt, float] | None = None,
              headers: dict[str, str] | None = None, remote: bool = False) -> Level:
    """Run one level (see the module docstring). User u's j-th request uses prompt
    (u * requests_per_user + j) % len(prompts). `body` makes a request's JSON from its prompt;
    `path` is /v1/completions or /v1/chat/completions. long: (a prompt, seconds): one more
    user sends that prompt once, that long after the level starts (its record is Level.long,
    user -1, prompt -1). headers: sent with every request (the server's API key). remote: the
    url may be on another machine (ServerTarget.remote)."""
    check_server_url(url, remote)
    plans = [[RequestRecord(u, j, (u * requests_per_user + j) % len(prompts))
              for j in range(requests_per_user)] for u in range(users)]
    delays = [0.0] * users
    long_record = None
    if long is not None:
        long_record = RequestRecord(-1, 0, -1)
        plans.append([long_record])
        delays.append(long[1])
        prompts = [*prompts, long[0]]  # prompt -1: the last
    timed_out = asyncio.run(_level(url.rstrip("/") + path, plans, delays, prompts, body,
                                   request_timeout_s, level_timeout_s, headers or {}))
    records = [r for plan in plans for r in plan if r is not long_record]
    return Level(users, records, timed_out, long_record)


async def _level(endpoint: str, plans: list[list[RequestRecord]], delays: list[float],
                 prompts: list[Prompt], body: RequestBody, request_timeout_s: float,
                 level_timeout_s: float, headers: dict[str, str]) -> bool:
    import httpx

    limits = httpx.Limits(max_connections=len(plans) + 2,
                          max_keepalive_connections=len(plans) + 2)
    # trust_env=False: no proxy from the environment; requests go straight to loopback.
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s), limits=limits,
                                 trust_env=False, headers=headers) as client:
        tasks = [asyncio.create_task(_user(client, endpoint, plan, prompts, body,
                                           request_timeout_s, delay))
                 for plan, delay in zip(plans, delays)]
        done, pending = await asyncio.wait(tasks, timeout=level_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for task in done:  # a bug in the loop itself is not a failed request: let it be seen
        if task.exception() is not None:
            raise task.exception()
    for plan in plans:
        for record in plan:
            if not record.sent:
                record.error = f"not sent: the level's {level_timeout_s:g} s ran out"
    return bool(pending)


async def _user(client, endpoint: str, plan: list[RequestRecord], prompts: list[Prompt],
                body: RequestBody, request_timeout_s: float, delay: float = 0.0) -> None:
    if delay:
        await asyncio.sleep(delay)
    for record in plan:
        try:
            await asyncio.wait_for(_request(client, endpoint, body(prompts[record.prompt]),
                                            record), request_timeout_s)
        except asyncio.TimeoutError:
            record.error = f"timeout: no complete response within {request_timeout_s:g} s"
        except asyncio.CancelledError:
            record.error = "cancelled: the level's time ran out"
            record.t_end = time.perf_counter()
            raise
        except Exception as exc:  # a refused connection, a torn stream, bad JSON: a failure
            record.error = f"{type(exc).__name__}: {exc}".strip()
        if record.t_end is None or record.error:
            record.t_end = time.perf_counter()


async def _request(client, endpoint: str, body: dict[str, Any], record: RequestRecord) -> None:
    record.t_sent = time.perf_counter()
    async with client.stream("POST", endpoint, json=body) as response:
        record.status = response.status_code
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            record.error = f"HTTP {response.status_code}: {text[:ERROR_CHARS]}".strip()
            return
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank lines between events, ": keepalive" comments
            data = line[5:].strip()
            if data == "[DONE]":
                break
            take_chunk(record, json.loads(data), time.perf_counter())
            if record.error:
                return
    record.t_end = time.perf_counter()
    if record.t_first is None:
        record.error = "the stream ended with no token"


def take_chunk(record: RequestRecord, chunk: dict[str, Any], now: float) -> None:
    """Fold one streamed chunk (completions or chat) into the record."""
    if not isinstance(chunk, dict):
        record.error = f"a stream chunk is not a JSON object: {str(chunk)[:ERROR_CHARS]}"
        return
    if chunk.get("error"):
        record.error = f"error in the stream: {str(chunk['error'])[:ERROR_CHARS]}"
        return
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        record.usage_tokens = usage["completion_tokens"]
    for choice in chunk.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        text = choice.get("text") or delta.get("content") or ""
        ids = choice.get("token_ids") or delta.get("token_ids") or []
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
        if ids:
            record.server_ids = (record.server_ids or []) + [int(i) for i in ids]
        tops = logprob_tops(choice.get("logprobs"))
        if tops is not None:
            record.tops = (record.tops or []) + tops
        if text or ids:
            record.text += text
            record.chunk_times.append(now)
            if record.t_first is None:
                record.t_first = now


def logprob_tops(logprobs: Any) -> list[dict[str, float]] | None:
    """Per token, the candidates listed (text -> logprob), from either OpenAI shape: completions'
    {"top_logprobs": [{text: logprob, ...}, ...]} or chat's {"content": [{"top_logprobs":
    [{"token": text, "logprob": ...}, ...]}, ...]}. Two tokens with the same text share one key;
    None without logprobs."""
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("top_logprobs"), list):
        tops = [top.items() if isinstance(top, dict) else [] for top in logprobs["top_logprobs"]]
    elif isinstance(logprobs.get("content"), list):
        tops = [[(t.get("token"), t.get("logprob")) for t in (entry.get("top_logprobs") or [])
                 if isinstance(t, dict)] for entry in logprobs["content"]]
    else:
        return None
    return [{str(text): float(lp) for text, lp in top if isinstance(lp, (int, float))}
            for top in tops]


def margin(top: dict[str, float] | None) -> float | None:
    """The top-1 minus the top-2 logprob (None when fewer than two are listed)."""
    if not top or len(top) < 2:
        return None
    first, second = sorted(top.values(), reverse=True)[:2]
    return first - second


# ---- counting ----------------------------------------------------------------------------------

def count_tokens(records: list[RequestRecord], tokenizer: Any) -> None:
    """Each successful record's output token count (the server's usage, else the token ids it
    sent, else the model's tokenizer on the streamed text; never words) and the ids compared
    with the single-user answer (the server's, else the tokenizer's)."""
    for record in records:
        if not record.ok:
            continue
        encoded = None
        if record.server_ids is not None:
            record.ids, record.ids_source = list(record.server_ids), "token_ids"
        else:
            encoded = tokenizer.encode(record.text, add_special_tokens=False)
            record.ids, record.ids_source = list(encoded), "tokenizer"
        if record.usage_tokens is not None:
            record.output_tokens, record.count_source = record.usage_tokens, "usage"
        elif record.server_ids is not None:
            record.output_tokens, record.count_source = len(record.server_ids), "token_ids"
        else:
            record.output_tokens, record.count_source = len(encoded), "tokenizer"


def generated_tokens(record: RequestRecord, stop_ids: Collection[int]) -> int:
    """The tokens a successful response generated, the end-of-sequence id that ended it (any of
    `stop_ids`) not counted (kvbench serve sends it as a token id with no text); 0 for a failed
    one. Call count_tokens first."""
    if not record.ok:
        return 0
    ids = record.ids
    return len(ids) - 1 if ids and ids[-1] in stop_ids else len(ids)


# ---- task samples: scores ---------------------------------------------------------------------

def scored_text(text: str, task: Task) -> str:
    """What of a response is scored: its text without its reasoning."""
    return split_reasoning(text, task.reasoning_opened).answer


def score_response(text: str, task: Task) -> float:
    """RULER's score of a response (0-100): its reasoning left out, postprocessed, then
    string_match_all or _part against the sample's references."""
    return sample_score(postprocess(scored_text(text, task)), task.references, task.metric)


def score_records(records: list[RequestRecord], prompts: list[Prompt]) -> None:
    """Each successful record of a task sample gets its response's score; the others keep
    None."""
    for record in records:
        task = prompts[record.prompt].task if record.prompt >= 0 else None
        record.score = score_response(record.text, task) if record.ok and task else None


# ---- correctness under load ---------------------------------------------------------------------

@dataclass
class Reference:
    """A prompt's single-user answer: its ids, text and listed candidates per token (None: no
    logprobs)."""

    ids: list[int]
    text: str
    tops: list[dict[str, float]] | None


@dataclass
class Comparison:
    agreement: float  # common prefix / the reference's length
    identical: bool
    first_difference: int | None  # the first position that differs (None: identical)
    margin: float | None  # the reference's top-2 margin there (None: unknown)
    # "identical", "near-tie", "perturbed" (both float noise) or "beyond noise" (flagged)
    kind: str

    @property
    def flagged(self) -> bool:
        return self.kind == "beyond noise"


def compare(ids: list[int], reference: Reference, tie_margin: float, shift_nats: float,
            tops: list[dict[str, float]] | None = None) -> Comparison:
    """A response (its ids, and its listed candidates per token when the server gave them)
    against the single-user answer to its prompt. At the first differing position both have
    read the same tokens, so a sound cache gives nearly the same next-token distribution twice.
    The difference is float noise when the answer's top-1 led its top-2 by at most `tie_margin`
    nats there (a near-tie that batching's other summation order flips), or when the two
    distributions are one context perturbed: each side's token is among the other's listed
    candidates and no candidate listed by both moved by more than `shift_nats` (a quantized
    cache turns float noise into whole rounding steps, which move logprobs by tenths of a nat).
    Anything else, or a difference that cannot be judged (no logprobs, past the answer's end),
    is beyond noise: a cache that leaks reads another context, with other candidates."""
    if not reference.ids:
        raise ValueError("a single-user answer with no tokens cannot be compared")
    prefix = 0
    for mine, theirs in zip(ids, reference.ids):
        if mine != theirs:
            break
        prefix += 1
    agreement = prefix / len(reference.ids)
    if ids == reference.ids:
        return Comparison(agreement, True, None, None, "identical")
    theirs, mine = candidates_at(reference.tops, prefix), candidates_at(tops, prefix)
    there = margin(theirs)
    if there is not None and there <= tie_margin:
        kind = "near-tie"
    elif _perturbed(theirs, mine, shift_nats):
        kind = "perturbed"
    else:
        kind = "beyond noise"
    return Comparison(agreement, False, prefix, there, kind)


def _perturbed(theirs: dict[str, float] | None, mine: dict[str, float] | None,
               shift_nats: float) -> bool:
    if not theirs or not mine:
        return False
    their_token, my_token = max(theirs, key=theirs.get), max(mine, key=mine.get)
    if their_token not in mine or my_token not in theirs:
        return False
    return all(abs(theirs[t] - mine[t]) <= shift_nats for t in theirs.keys() & mine.keys())


def candidates_at(tops: list[dict[str, float]] | None,
                  position: int | None) -> dict[str, float] | None:
    """The candidates listed at `position` (None: no logprobs, or past their end)."""
    if position is None:
        return None
    return tops[position] if tops is not None and position < len(tops) else None
