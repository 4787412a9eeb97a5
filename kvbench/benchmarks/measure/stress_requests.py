"""The stress client's requests: its tokenizer and the ids that end an answer, its prompts (text
windows, RULER samples, the long one), bodies."""
from __future__ import annotations

from random import Random
from typing import Any

from kvbench.benchmarks.measure.load_generator import Prompt, Task
from kvbench.benchmarks.specs.server_target import ServerTarget
from kvbench.benchmarks.specs.stress import StressParams
from kvbench.data.text import load_text, text_tokens
from kvbench.memo import Memo
from kvbench.models.chat import with_system
from kvbench.models.options import ChatOptions

TOP_LOGPROBS = 5  # candidates asked per token: what tells noise from another context


def client_tokenizer(memo: Memo, spec: str | None, revision: str | None = None,
                     trust_remote_code: bool = False) -> tuple[Any, frozenset[int]]:
    """The suite's model's tokenizer alone (no weights: the server has the model) at the
    case's hub commit, and every id that ends its answers (the tokenizer's eos and the
    checkpoint's generation_config.json's: a server stops at each), once per run."""
    if spec is None:
        raise ValueError("stress needs a model (its tokenizer makes the prompts and counts"
                         " tokens); set the suite's model")
    from kvbench.models.loading import load_client_tokenizer

    return memo.get(("stress_tokenizer", spec, revision),
                    lambda: load_client_tokenizer(spec, None, revision, trust_remote_code))


class _TokenizerOnly:
    """What kvbench.data.text.text_tokens asks of a session: a tokenizer and a memo key."""

    def __init__(self, tokenizer: Any, spec: str):
        self.tokenizer, self.memo_key = tokenizer, ("tokenizer", spec)


def make_prompts(memo: Memo, tokenizer: Any, spec: str, params: StressParams,
                 seed: int) -> list[Prompt]:
    """`params.prompts` windows of `prompt_tokens` tokens of the text, at distinct offsets from
    `params.offset` on, drawn with `seed`; each after the same window of shared_prefix_tokens,
    drawn with seed + 1, when set."""
    windows = text_windows(memo, tokenizer, spec, params, params.prompt_tokens, params.prompts,
                           seed)
    if params.shared_prefix_tokens:
        shared = text_windows(memo, tokenizer, spec, params, params.shared_prefix_tokens, 1,
                              seed + 1)[0]
        windows = [shared + window for window in windows]
    return [Prompt(index, tokenizer.decode(ids), ids) for index, ids in enumerate(windows)]


def make_task_prompts(memo: Memo, tokenizer: Any, params: StressParams,
                      options: ChatOptions = ChatOptions(), model: str = "the model",
                      ) -> list[Prompt]:
    """`params.prompts` samples of the task (indices 0 ..), made as the ruler benchmark makes
    them: kvbench.data.ruler's make_sample fitted to task_length tokens of the prompt as it is
    fed (the model's chat template with the chat options around the context and question, then
    the answer prefix), with data_seed."""
    from kvbench.benchmarks.measure.answering import ChatFrame, frame
    from kvbench.data.ruler import make_sample

    spec = params.task_spec
    chat = ChatFrame.of(tokenizer, options, model)
    essay = (memo.get(("essay", params.essay), lambda: load_text(params.essay))
             if spec.needs_essay else None)

    def framed(sample):
        return frame(tokenizer, chat, sample.context, sample.question, sample.answer_prefix)

    prompts = []
    for index in range(params.prompts):
        sample = make_sample(params.task, index, length=params.task_length,
                             count_tokens=lambda s: len(framed(s).ids), seed=params.data_seed,
                             essay=essay)
        ids = framed(sample).ids
        task = Task(params.task, tuple(sample.references), spec.metric,
                    sample.tokens_to_generate, sample.context + sample.question,
                    chat.reasoning_opened)
        prompts.append(Prompt(index, tokenizer.decode(ids), ids, task))
    return prompts


def make_long_prompt(memo: Memo, tokenizer: Any, spec: str, params: StressParams,
                     seed: int) -> Prompt:
    """The long-prompt user's prompt: a window of `long_prompt_tokens` tokens of the text from
    `params.offset` on, at an offset drawn with `seed`."""
    ids = text_windows(memo, tokenizer, spec, params, params.long_prompt_tokens, 1, seed)[0]
    return Prompt(-1, tokenizer.decode(ids), ids)


def text_windows(memo: Memo, tokenizer: Any, spec: str, params: StressParams, length: int,
                 count: int, seed: int) -> list[list[int]]:
    """`count` windows of `length` tokens of the text, at distinct offsets from `params.offset`
    on, drawn with `seed`."""
    tokens = text_tokens(memo, _TokenizerOnly(tokenizer, spec), params.text)
    starts = len(tokens) - length - params.offset + 1
    if starts < count:
        raise ValueError(f"text {params.text!r} has {len(tokens)} tokens: too few for"
                         f" {count} distinct windows of {length} tokens from offset"
                         f" {params.offset}")
    offsets = Random(seed).sample(range(params.offset, params.offset + starts), count)
    return [list(tokens[start : start + length]) for start in offsets]


def request_body(params: StressParams, target: ServerTarget, model: str | None,
                 prompt: Prompt, chat: ChatOptions = ChatOptions()) -> dict[str, Any]:
    """One streamed greedy request. A kvbench server gets the prompt's token ids (completions),
    top-5 logprobs, and the token_ids / ignore_eos extensions; another server the standard
    fields only (logprobs when its mapping asks). A task sample asks its task's
    tokens_to_generate and is never sent ignore_eos (its answer ends at end-of-sequence); on
    chat, its message is the sample's text, which the server frames with its own template (the
    answer prefix is not sent), after the chat options' system message, with their template
    arguments as chat_template_kwargs (vLLM's field)."""
    kvbench = target.kind == "kvbench"
    task = prompt.task
    body: dict[str, Any] = {"max_tokens": task.tokens_to_generate if task else params.max_tokens,
                            "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    logprobs = kvbench or target.logprobs
    if params.api == "completions":
        body["prompt"] = prompt.ids if kvbench else prompt.text
        if logprobs:
            body["logprobs"] = TOP_LOGPROBS
    else:
        body["messages"] = with_system(
            [{"role": "user", "content": task.message if task else prompt.text}], chat)
        if chat.template_kwargs:
            body["chat_template_kwargs"] = dict(chat.template_kwargs)
        if logprobs:
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
    if kvbench:
        body["return_token_ids"] = True
        if params.ignore_eos and task is None:
            body["ignore_eos"] = True
    return body
