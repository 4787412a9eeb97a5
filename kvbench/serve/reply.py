"""One request's OpenAI-shaped response, whole or as stream chunks: text decoded from the tokens,
stop strings and stop token ids, echo (with the prompt's logprobs when it was scored), logprobs,
usage, a chat answer's reasoning apart (`reasoning_content`, with a reasoning parser); and a
batch of prompts' replies as one response, a choice per prompt."""
from __future__ import annotations

import time
import uuid
from typing import Any

from kvbench.models.chat import decode_answer, skipped_markers, split_reasoning
from kvbench.serve.events import Finished, Scored, Token


class Reply:
    """Builds one request's OpenAI-shaped response, whole or chunk by chunk. With stop strings
    the text ends before the first one (the tail that could begin one is held back while
    streaming); a stop token id ends it before that token. With `reasoning` (a chat reply under
    a reasoning parser), the text's <think>…</think> block (kvbench.models.chat.split_reasoning;
    reasoning_opened: the prompt opened it) goes to reasoning_content, the rest to content."""

    def __init__(self, tokenizer, chat: bool, model_id: str, with_token_ids: bool,
                 prompt_tokens: int, stops: list[str], stop_ids: set[int], echo: str = "",
                 usage_in_chunks: bool = False, logprobs: bool = False, index: int = 0,
                 reasoning: bool = False, reasoning_opened: bool = False):
        self.tokenizer, self.chat, self.model_id = tokenizer, chat, model_id
        self.with_token_ids, self.prompt_tokens = with_token_ids, prompt_tokens
        self.stops, self.stop_ids, self.echo = stops, stop_ids, echo
        self.usage_in_chunks, self.logprobs, self.index = usage_in_chunks, logprobs, index
        self.prompt_scores: list[Token] = []  # a scored prompt's tokens, once Scored came
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tokens: list[Token] = []  # kept in the reply
        self.generated = 0  # tokens the engine generated (usage), a stop token included
        self.text = ""  # the text sent so far
        self.stopped = False  # a stop string or stop token ended the reply
        self.streaming = False  # set by chunk(): a stream decodes at every token
        self.reasoning, self.reasoning_opened = reasoning, reasoning_opened
        # the markers kept in the text for the parser, even where they are special tokens
        self.markers = skipped_markers(tokenizer) if reasoning else {}
        self.sent = {"reasoning_content": "", "content": ""}  # a stream's parts sent so far

    def add(self, token: Token) -> str:
        """Record `token`; return the new text it completes (held back while it ends inside a
        multi-byte character or could be the start of a stop string)."""
        self.generated += 1
        if token.id in self.stop_ids:
            self.stopped = True
            return self._flush()
        self.tokens.append(token)
        if not self.stops and not self.streaming:
            return ""  # whole replies decode once, at the end
        text = self._decoded()
        if self.stops:
            text, self.stopped = self._cut_at_stop(text)
            if not self.stopped:
                text = text[:len(text) - max(map(len, self.stops)) + 1]
        if text.endswith("\ufffd") and not self.stopped:
            return ""
        delta, self.text = text[len(self.text):], text
        return delta

    def _flush(self) -> str:
        """What is held back, once the reply has ended."""
        text = self._final_text()
        delta, self.text = text[len(self.text):], text
        return delta

    def _final_text(self) -> str:
        return self._cut_at_stop(self._decoded())[0]

    def _cut_at_stop(self, text: str) -> tuple[str, bool]:
        """`text` up to its first stop string, and whether it had one."""
        cut = min((at for stop in self.stops if (at := text.find(stop)) >= 0), default=-1)
        return (text, False) if cut < 0 else (text[:cut], True)

    def finished(self) -> Finished:
        """The end of a reply that a stop string or stop token ended."""
        return Finished("stop", self.prompt_tokens, self.generated)

    def scored(self, event: Scored) -> None:
        self.prompt_scores = event.tokens

    def _logprobs(self, tokens: list[Token], prompt: list[Token] | None = None,
                  whole: bool = False) -> dict[str, Any] | None:
        """The logprobs of `tokens` (after the `prompt`'s, echoed); None where none were asked,
        or for a chunk that carries no token."""
        if not self.logprobs or not (tokens or prompt or whole):
            return None
        piece = lambda i: self.tokenizer.decode([i])  # noqa: E731
        if self.chat:
            return {"content": [{"token": piece(t.id), "logprob": t.logprob,
                                 "top_logprobs": [{"token": piece(i), "logprob": lp}
                                                  for i, lp in t.top]} for t in tokens]}
        tokens = [*(prompt or []), *tokens]
        tops: list[dict[str, float] | None] = []
        for t in tokens:  # keyed by text: of two tokens that decode alike, the likelier stays
            top: dict[str, float] = {}
            for i, lp in t.top:
                top.setdefault(piece(i), lp)
            tops.append(top if t.logprob is not None else None)  # a prompt's first: none
        return {"tokens": [piece(t.id) for t in tokens],
                "token_logprobs": [t.logprob for t in tokens], "top_logprobs": tops}

    def _choice(self, text: str, tokens: list[Token], finish: str | None,
                whole: bool = False, prompt: list[Token] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": self.index, "finish_reason": finish,
                                  "logprobs": self._logprobs(tokens, prompt, whole)}
        if self.chat:
            choice["message" if whole else "delta"] = {"role": "assistant",
                                                       **self._content(text, whole)}
        else:
            choice["text"] = text
        if self.with_token_ids:
            choice["token_ids"] = [t.id for t in tokens]
        return choice

    def _content(self, text: str, whole: bool) -> dict[str, Any]:
        """A chat message's content (whole: its text; a delta: the text new since the last),
        its reasoning apart under the parser: a delta's from the whole text sent so far."""
        if not self.reasoning:
            return {"content": text}
        parts = split_reasoning(text if whole else self.text, self.reasoning_opened)
        if whole:
            return {"content": parts.answer, "reasoning_content": parts.reasoning}
        delta = {}
        for key, now in (("reasoning_content", parts.reasoning or ""), ("content", parts.answer)):
            if now.startswith(self.sent[key]) and len(now) > len(self.sent[key]):
                delta[key], self.sent[key] = now[len(self.sent[key]):], now
        return {"content": delta.pop("content", ""), **delta}

    def _envelope(self, choices: list, whole: bool = False, **extra) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion" if whole else "chat.completion.chunk"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id,
                "choices": choices, **extra}

    def _running_usage(self) -> dict[str, Any]:
        if not self.usage_in_chunks:
            return {}
        return {"usage": self.usage(Finished("", self.prompt_tokens, self.generated))}

    def echo_chunk(self) -> dict[str, Any]:
        return self._envelope([self._choice(self.echo, [], None, prompt=self.prompt_scores)])

    def chunk(self, token: Token) -> tuple[dict[str, Any], bool]:
        """The chunk of `token` and whether it carries anything (text or a kept token): the
        token that completed a stop string is kept, a stop token id is not."""
        self.streaming = True
        delta = self.add(token)
        kept = [token] if self.tokens and self.tokens[-1] is token else []
        chunk = self._envelope([self._choice(delta, kept, None)], **self._running_usage())
        return chunk, bool(delta or kept)

    def last_chunk(self, finished: Finished) -> dict[str, Any]:
        """The finish reason, with any text held back at the end (a cut multi-byte character,
        the tail that could have begun a stop string)."""
        return self._envelope([self._choice(self._flush(), [], finished.reason)],
                              **self._running_usage())

    def usage(self, finished: Finished) -> dict[str, int]:
        return {"prompt_tokens": finished.prompt_tokens,
                "completion_tokens": finished.completion_tokens,
                "total_tokens": finished.prompt_tokens + finished.completion_tokens}

    def usage_chunk(self, finished: Finished) -> dict[str, Any]:
        return self._envelope([], usage=self.usage(finished))

    def whole(self, finished: Finished) -> dict[str, Any]:
        choice = self._choice(self.echo + self._final_text(), self.tokens, finished.reason,
                              whole=True, prompt=self.prompt_scores)
        return self._envelope([choice], whole=True, usage=self.usage(finished))

    def _decoded(self) -> str:
        return decode_answer(self.tokenizer, [t.id for t in self.tokens], self.markers)


def whole_batch(replies: list[Reply], ends: list[Finished]) -> dict[str, Any]:
    """One response to a batch of prompts: each reply's choice (indexed by its prompt), their
    usage summed."""
    answers = [reply.whole(end) for reply, end in zip(replies, ends, strict=True)]
    usage = {key: sum(a["usage"][key] for a in answers) for key in answers[0]["usage"]}
    return {**answers[0], "choices": [a["choices"][0] for a in answers], "usage": usage}
