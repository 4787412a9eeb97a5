"""Questions answered through a method's cache, for the benchmarks that answer (ruler, niah,
dataset, multiturn).

A prompt is framed by the model's chat template (RULER's scripts/data/template.py does the same
per model family), with the case's chat options (a system message, the template's arguments:
kvbench.models.chat), and cut in two: the context, which `compress: context` prefills and
compresses before the question is seen, and the question with the template's close and the
answer prefix. The answer is decoded greedily through the same cache, one token per step, until
any of the model's end-of-sequence ids (session.stop_ids) or the task's tokens_to_generate; the
prompts of a group are decoded together, one batched forward per step
(kvbench.models.batch_step). An answer's reasoning (<think>…</think>) is kept in its text and
left out of what is scored (kvbench.models.chat.split_reasoning).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kvbench.methods.core.contracts import Implementation
from kvbench.methods.core.read_parts import READ_PART_BYTES
from kvbench.models.chat import (
    chat_text, decode_answer, has_chat_template, opens_reasoning, refuse_without_template,
    split_reasoning,
)
from kvbench.models.options import ChatOptions
from kvbench.models.session import (
    Session, kv_bytes_per_layer_token, plain_kv_bytes, prefill, shares_prefill,
)
from kvbench.models.shared_prefill import PrefillStore

_SLOT = "\uE000kvbench-message\uE000"  # private-use marks: no chat template contains them


@dataclass(frozen=True)
class ChatFrame:
    """The chat template's text around one user message, up to the assistant's first token."""

    before: str
    after: str
    reasoning_opened: bool = False  # the template's close opens a reasoning block

    @classmethod
    def of(cls, tokenizer: Any, options: ChatOptions = ChatOptions(),
           model: str = "the model") -> ChatFrame:
        """The frame with options' system message and template arguments (ValueError naming
        `model` where its template refuses them)."""
        if not has_chat_template(tokenizer):
            refuse_without_template(options, model)
            return cls("", "")  # a base model: the task text as it is (RULER's "base" template)
        text = chat_text(tokenizer, [{"role": "user", "content": _SLOT}], options, model)
        before, _, after = text.partition(_SLOT)
        return cls(before, after, opens_reasoning(after))


@dataclass(frozen=True)
class Prompt:
    context: list[int]  # the template's opening and the task's context
    question: list[int]  # the question, the template's close, the answer prefix
    reasoning_opened: bool = False  # the answer starts inside a reasoning block (ChatFrame's)

    @property
    def ids(self) -> list[int]:
        return self.context + self.question

    def compressed(self, compress: str) -> list[int]:
        """What is prefilled and compressed before the rest is fed (`compress` as RetrievalParams)."""
        return self.context if compress == "context" else self.ids


def frame(tokenizer: Any, chat: ChatFrame, context: str, question: str,
          answer_prefix: str) -> Prompt:
    """The two halves tokenised apart, so both compress settings feed the same tokens. Special
    tokens come from the template's text; a model without a template gets its tokenizer's own
    (e.g. BOS) on the context."""
    plain = not chat.before and not chat.after
    return Prompt(
        tokenizer.encode(chat.before + context, add_special_tokens=plain),
        tokenizer.encode(question + chat.after + answer_prefix, add_special_tokens=False),
        chat.reasoning_opened,
    )


@dataclass(frozen=True)
class Answer:
    text: str  # as generated, its reasoning included
    scored: str  # what is scored: the text without its reasoning (answer_text)
    generated: int  # tokens decoded, end-of-sequence not counted
    # the question's forward (compress: context) and the decode steps the answer took part in;
    # a timing, not part of what the answer is
    seconds: float = field(compare=False)
    kv_bytes: int  # accounted K+V bytes the cache holds at the end, all layers
    bytes_16bit: int  # 16-bit K+V of every token the cache has seen
    bytes_plain: int  # the plain cache's K+V of every token seen, at the model's dtype
    decoded_reads: bool  # the codec's decoded-once path ran (RetrievalParams.reads)


def answer_all(session: Session, method: Implementation, prompts: list[Prompt], compress: str,
               max_new_tokens: list[int], reads: str = "auto",
               status: Callable[[str], None] = lambda text: None,
               shared: PrefillStore | None = None, chunk: int = 0) -> list[Answer]:
    """Prefill and compress each prompt through its own cache, in forwards of `chunk` tokens (0:
    one; `compress` says whether the question is in what is compressed), then decode greedily
    through the compressed caches together: one batched forward per step for the rows still
    answering (session.step_rows), each stopping at end-of-sequence or its own max_new_tokens. Under
    `context` the method never sees the question before end_prefill: a method's probe is its own
    reference_probe of the context. shared: where a method that shares_prefill takes each prompt's
    plain prefill from."""
    caches, logits, question_s = [], [], []
    for number, prompt in enumerate(prompts, 1):
        status(f"prefill {number}/{len(prompts)}")
        # room for the question and the answer: a buffer that fills up is copied to a larger one
        fed, total = prompt.compressed(compress), len(prompt.ids) + max_new_tokens[number - 1]
        cache = session.new_cache(method, decoded_reads=keeps_decoded(session, reads, total))
        session.reserve(cache, total)
        last = prefill_through(session, cache, fed, method, chunk, shared, total - len(fed))
        seconds = 0.0
        if compress == "context":
            last, seconds = session.step(prompt.question, cache, last_only=True)
        caches.append(cache)
        logits.append(last[-1])
        question_s.append(seconds)
    decoded = decode_rows(session, caches, logits, max_new_tokens, status)
    return [_answer(session, cache, row, asked_s, prompt.reasoning_opened)
            for cache, row, asked_s, prompt in zip(caches, decoded, question_s, prompts)]


def keeps_decoded(session: Session, reads: str, tokens: int) -> bool:
    """Whether a codec cache of `tokens` tokens keeps its packed chunks decoded (the decoded-once
    path, RetrievalParams.reads): as asked, or under auto where one layer's decoded copy takes
    at most READ_PART_BYTES (a larger copy would add the plain cache again to what a case
    holds, for speed)."""
    if reads != "auto":
        return reads == "decoded"
    return tokens * kv_bytes_per_layer_token(session, session.kv_element_size) <= READ_PART_BYTES


def prefill_through(session: Session, cache: Any, ids: list[int], method: Implementation,
                    chunk: int, shared: PrefillStore | None, room: int = 0):
    """The prompt `ids` prefilled and compressed through `cache` in forwards of `chunk` tokens,
    or ingested from `shared`'s recording where the method takes it (recorded with `room` for
    the tokens that follow); its last logits (1, vocab). Only prefill() holds the recording
    (no name here does), so it is let go before the method compacts: the method holds what it
    keeps of it."""
    shared = shared if shared and shares_prefill(session, method, len(ids), chunk) else None
    return prefill(session, cache, ids, method, chunk=chunk, prefilled=shared and shared.get(
        session, ids, chunk, method.prompt_queries, room))[0]


@dataclass(frozen=True)
class Decoded:
    """One row's greedy answer."""

    tokens: list[int]  # generated, end-of-sequence not counted
    unfed: list[int]  # its tokens not fed through the cache yet: the last, when it hit its most
    seconds: float  # wall time of the batched steps the row took part in


def decode_rows(session: Session, caches: list, logits: list, max_new_tokens: list[int],
                status: Callable[[str], None] = lambda text: None) -> list[Decoded]:
    """Greedy answers of rows whose caches have read their prompts (logits[i]: row i's last
    logits, (vocab,)): one batched forward per step for the rows still answering
    (session.step_rows), each stopping at any of session.stop_ids or its own max_new_tokens."""
    stops = session.stop_ids
    generated: list[list[int]] = [[] for _ in caches]
    seconds = [0.0] * len(caches)
    rows = list(range(len(caches)))
    while rows:
        answering = []
        for row, row_logits in zip(rows, logits, strict=True):
            token = int(row_logits.argmax())
            if token not in stops:
                generated[row].append(token)
                if len(generated[row]) < max_new_tokens[row]:
                    answering.append(row)
        rows = answering
        if rows:
            status(f"decode {max(len(generated[row]) for row in rows)}/{max(max_new_tokens)}"
                   f" ({len(rows)} answering)")
            start = time.perf_counter()  # the logits come back on the CPU: the step is done
            logits = session.step_rows([generated[row][-1] for row in rows],
                                       [caches[row] for row in rows])
            took = time.perf_counter() - start
            for row in rows:
                seconds[row] += took
    return [Decoded(tokens, tokens[-1:] if len(tokens) == most else [], took_s)
            for tokens, most, took_s in zip(generated, max_new_tokens, seconds)]


def answer_text(session: Session, tokens: list[int], reasoning_opened: bool) -> tuple[str, str]:
    """(an answer's text, reasoning included; what is scored: the text without its reasoning)."""
    text = decode_answer(session.tokenizer, tokens)
    return text, split_reasoning(text, reasoning_opened).answer


def _answer(session: Session, cache: Any, decoded: Decoded, question_s: float,
            reasoning_opened: bool) -> Answer:
    bytes_16bit, bytes_plain = plain_kv_bytes(session, cache)
    text, scored = answer_text(session, decoded.tokens, reasoning_opened)
    return Answer(
        text=text,
        scored=scored,
        generated=len(decoded.tokens),
        seconds=question_s + decoded.seconds,
        kv_bytes=cache.accounted_bytes(),
        bytes_16bit=bytes_16bit,
        bytes_plain=bytes_plain,
        decoded_reads=bool(getattr(cache, "decoded_reads", False)),
    )
