"""How a chat model is asked and how its answer is read, alike for every benchmark and for
`kvbench serve`: the chat template applied with a case's ChatOptions (a system message first,
the template's extra arguments such as Qwen3's enable_thinking), the ids that end an answer (the
tokenizer's eos and those the checkpoint's generation_config.json lists: Llama 3's <|eot_id|>,
Gemma's <end_of_turn>, Qwen's <|im_end|>), and an answer's reasoning (a `<think>…</think>` block,
as Qwen3, QwQ and DeepSeek-R1 write it) told apart from what is scored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from kvbench.models.options import ChatOptions

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def with_system(messages: list[dict[str, str]], options: ChatOptions) -> list[dict[str, str]]:
    """`messages` after options' system message, unless they open with a system message of
    their own (which is kept in its place)."""
    if options.system_prompt is None or (messages and messages[0]["role"] in ("system",
                                                                                "developer")):
        return list(messages)
    return [{"role": "system", "content": options.system_prompt}, *messages]


def chat_text(tokenizer: Any, messages: list[dict[str, str]], options: ChatOptions,
              model: str) -> str:
    """The chat template's text of `messages` (after options' system message) up to the
    assistant's first token, with options' template arguments. A template without a system role
    does what it does with one (Gemma 3's folds it into the first user turn); ValueError naming
    the model where the template raises (Gemma 2's refuses a system message), or where the model
    has no chat template and options ask for one."""
    if not has_chat_template(tokenizer):
        refuse_without_template(options, model)
    try:
        return tokenizer.apply_chat_template(with_system(messages, options), tokenize=False,
                                             add_generation_prompt=True,
                                             **options.template_kwargs)
    except Exception as exc:  # noqa: BLE001 - jinja's errors, the template's raise_exception
        asked = [what for what, given in (("a system message", options.system_prompt),
                                          ("chat_template_kwargs " + str(options.template_kwargs),
                                           options.template_kwargs)) if given]
        raise ValueError(f"model {model}: its chat template fails"
                         f"{' with ' + ' and '.join(asked) if asked else ''}: {exc}") from None


def refuse_without_template(options: ChatOptions, model: str) -> None:
    """ValueError where options ask for a system message or template arguments of a model that
    has no chat template (a base model is asked with the task's text as it is)."""
    if options.system_prompt is not None or options.template_kwargs:
        raise ValueError(f"model {model} has no chat template, so system_prompt and"
                         " chat_template_kwargs cannot apply to it: leave them out")


def stop_ids(tokenizer: Any, generation_ids: Iterable[int]) -> frozenset[int]:
    """Every id that ends an answer: the tokenizer's eos and the generation config's."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return frozenset([*generation_ids, *([eos] if isinstance(eos, int) else [])])


# ---- reasoning ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reasoned:
    reasoning: str | None  # the block's text, markers left out; None: the text has no block
    answer: str  # what is scored: the text without the block


def split_reasoning(text: str, opened: bool = False) -> Reasoned:
    """An answer's reasoning told apart from what is scored; the one place kvbench does it.

    A `<think>…</think>` block, or an unclosed `<think>` up to the end, is reasoning; so is the
    text up to a `</think>` that no `<think>` precedes, or, when the prompt opened the block
    (`opened`: its template ends inside one, as DeepSeek-R1's does), the whole text until one
    comes. The answer is what came before the block and what follows it, the white space
    that opens what follows left out. A text without a block is all answer, as it is."""
    start, end = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if start >= 0 and (end < 0 or start < end):
        before, inside = text[:start], text[start + len(THINK_OPEN):]
        end = inside.find(THINK_CLOSE)
        if end < 0:
            return Reasoned(inside, before)
        return Reasoned(inside[:end], before + inside[end + len(THINK_CLOSE):].lstrip())
    if end >= 0:
        return Reasoned(text[:end], text[end + len(THINK_CLOSE):].lstrip())
    return Reasoned(text, "") if opened else Reasoned(None, text)


def opens_reasoning(prompt_text: str) -> bool:
    """Whether a prompt's text ends inside a reasoning block (its template opened one for the
    model to close): Qwen3's with enable_thinking false ends after an empty, closed one."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def skipped_markers(tokenizer: Any) -> dict[int, str]:
    """The reasoning markers that are single tokens which skip_special_tokens drops (Qwen3's
    are ordinary added tokens and stay; another model may mark them special): id -> text."""
    to_id = getattr(tokenizer, "convert_tokens_to_ids", None)
    if to_id is None:
        return {}
    found = {}
    for marker in (THINK_OPEN, THINK_CLOSE):
        token = to_id(marker)
        if isinstance(token, int) and tokenizer.decode([token]) == marker \
                and tokenizer.decode([token], skip_special_tokens=True) == "":
            found[token] = marker
    return found


def decode_answer(tokenizer: Any, ids: list[int], markers: dict[int, str] | None = None) -> str:
    """An answer's text: its tokens decoded without special tokens, the reasoning markers kept
    (markers: skipped_markers(tokenizer), where the caller has it already)."""
    markers = skipped_markers(tokenizer) if markers is None else markers
    if not any(token in markers for token in ids):
        return tokenizer.decode(ids, skip_special_tokens=True)
    parts, run = [], []
    for token in ids:
        if token in markers:
            parts += [tokenizer.decode(run, skip_special_tokens=True), markers[token]]
            run = []
        else:
            run.append(token)
    return "".join(parts) + tokenizer.decode(run, skip_special_tokens=True)
