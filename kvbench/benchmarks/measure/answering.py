"""Questions answered through a method's cache, for the retrieval benchmarks (ruler, niah).

A prompt is framed by the model's chat template (RULER's scripts/data/template.py does the same
per model family) and cut in two: the context, which `compress: context` prefills and
compresses before the question is seen, and the question with the template's close and the
answer prefix. The answer is decoded greedily through the same cache, one token per step, until
the model's end-of-sequence token or the task's tokens_to_generate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, plain_kv_bytes, prefill
from kvbench.models.shared_prefill import PrefillStore

_SLOT = "\uE000kvbench-message\uE000"  # private-use marks: no chat template contains them


@dataclass(frozen=True)
class ChatFrame:
    """The chat template's text around one user message, up to the assistant's first token."""

    before: str
    after: str

    @classmethod
    def of(cls, tokenizer: Any) -> ChatFrame:
        if not getattr(tokenizer, "chat_template", None):
            return cls("", "")  # a base model: the task text as it is (RULER's "base" template)
        text = tokenizer.apply_chat_template([{"role": "user", "content": _SLOT}], tokenize=False,
                                             add_generation_prompt=True)
        before, _, after = text.partition(_SLOT)
        return cls(before, after)


@dataclass(frozen=True)
class Prompt:
    context: list[int]  # the template's opening and the task's context
    question: list[int]  # the question, the template's close, the answer prefix

    @property
    def ids(self) -> list[int]:
        return self.context + self.question


def frame(tokenizer: Any, chat: ChatFrame, context: str, question: str,
          answer_prefix: str) -> Prompt:
    """The two halves tokenised apart, so both compress settings feed the same tokens. Special
    tokens come from the template's text; a model without a template gets its tokenizer's own
    (e.g. BOS) on the context."""
    plain = not chat.before and not chat.after
    return Prompt(
        tokenizer.encode(chat.before + context, add_special_tokens=plain),
        tokenizer.encode(question + chat.after + answer_prefix, add_special_tokens=False),
    )


@dataclass(frozen=True)
class Answer:
    text: str
    generated: int  # tokens decoded, end-of-sequence not counted
    kv_bytes: int  # accounted K+V bytes the cache holds at the end, all layers
    bytes_16bit: int  # 16-bit K+V of every token the cache has seen
    bytes_plain: int  # the plain cache's K+V of every token seen, at the model's dtype
    decoded_reads: bool  # the codec's decoded-once path ran (RetrievalParams.reads)


def answer(session: Session, method: Implementation, prompt: Prompt, compress: str,
           max_new_tokens: int, reads: str = "decoded",
           status: Callable[[str], None] = lambda text: None,
           shared: PrefillStore | None = None) -> Answer:
    """Prefill and compress (`compress` says whether the question is in what is compressed),
    then decode greedily through the compressed cache. Under `context` the method never sees the
    question before end_prefill: a method's probe is its own reference_probe of the context.
    shared: where a method that shares_prefill takes the prompt's one plain prefill from."""
    cache = session.new_cache(method, decoded_reads=reads == "decoded")
    status("prefill")
    prefix = prompt.context if compress == "context" else prompt.ids
    prefilled = shared.get(session, prefix) if shared and method.shares_prefill else None
    logits, _, _ = prefill(session, cache, prefix, method, prefilled=prefilled)
    if compress == "context":
        logits, _ = session.step(prompt.question, cache, last_only=True)
    eos = session.tokenizer.eos_token_id
    generated: list[int] = []
    while True:
        token = int(logits[-1].argmax())
        if token == eos:
            break
        generated.append(token)
        if len(generated) == max_new_tokens:
            break
        status(f"decode {len(generated)}/{max_new_tokens}")
        logits, _ = session.step([token], cache, last_only=True)
    bytes_16bit, bytes_plain = plain_kv_bytes(session, cache)
    return Answer(
        text=session.tokenizer.decode(generated, skip_special_tokens=True),
        generated=len(generated),
        kv_bytes=cache.accounted_bytes(),
        bytes_16bit=bytes_16bit,
        bytes_plain=bytes_plain,
        decoded_reads=bool(getattr(cache, "decoded_reads", False)),
    )
