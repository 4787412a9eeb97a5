"""One shared context asked several questions, for the multiturn benchmark (SCBench's two modes,
microsoft/MInference scbench/, arXiv 2412.10319), generated offline from RULER's niah: an essay
haystack (the `essay` text, as ruler's niah tasks use) holding one needle per turn, "One of the
special magic numbers for {key} is: {value}." (a distinct word key, a 7-digit value), fitted to
`length` tokens of the caller's model as kvbench.data.ruler fits its samples (the context, the
first question and RULER's 128 tokens to generate). Turn t asks one key in RULER's single-needle
wording; the keys are asked in a random order of the needles (not their order in the text), so
the later turns are not all about the end of the context. Deterministic in (seed, index, length,
turns) and the caller's token count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbench.data.ruler import RulerSample, key_question, make_multikey_sample
from kvbench.data.ruler.tasks import NEEDLE


@dataclass(frozen=True)
class Turn:
    key: str
    question: str  # as asked right after the context ("\nWhat is the special magic number ...?")
    answer_prefix: str  # " The special magic number for {key} mentioned in the provided text is"
    references: tuple[str, ...]  # the key's value
    depth: float  # the asked needle's depth in the haystack, percent (as RulerSample.depths)

    @property
    def message(self) -> str:
        """The question as a user message of its own (a later turn): without the newline that
        parts it from the context in the first message."""
        return self.question.removeprefix("\n")


@dataclass(frozen=True)
class Conversation:
    index: int
    context: str  # RULER's head and the haystack: what is compressed once
    turns: tuple[Turn, ...]
    sample: RulerSample  # what was fitted: the context with the first turn's question


def make_conversation(index: int, *, turns: int, length: int,
                      count_tokens: Callable[[RulerSample], int], seed: int,
                      essay: str) -> Conversation:
    """`turns` needles in one essay haystack and a question per needle. count_tokens(sample):
    the prompt of the context and the first question as the caller renders it (chat template,
    answer prefix); with RULER's 128 tokens to generate it is fitted into [0.99 * length,
    length]."""
    if turns < 1:
        raise ValueError(f"a conversation needs at least one turn, got {turns}")
    sample = make_multikey_sample(index, keys=turns, length=length, count_tokens=count_tokens,
                                  seed=seed, essay=essay)
    # sample.depths are the needles' depths in text order: rank each key by where its needle is
    where = {key: sample.context.index(NEEDLE.format(type_needle_v="numbers", key=key,
                                                     value=value))
             for key, value in zip(sample.queries, sample.references, strict=True)}
    in_text = sorted(where, key=where.get)
    asked = []
    for key, value in zip(sample.queries, sample.references, strict=True):
        question, answer_prefix = key_question(key)
        asked.append(Turn(key, question, answer_prefix, (value,),
                          sample.depths[in_text.index(key)]))
    return Conversation(index, sample.context, tuple(asked), sample)
