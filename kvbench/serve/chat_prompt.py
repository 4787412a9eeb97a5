"""A chat request's prompt: its messages framed by the model's chat template
(kvbench.models.chat) with the server's chat options (`kvbench serve --system-prompt`,
`--chat-template-kwargs`) under the request's own: a request that opens with a system message
keeps it, and its chat_template_kwargs override the server's key by key, as vLLM's do."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench.models.chat import chat_text, has_chat_template, opens_reasoning, with_system
from kvbench.models.options import ChatOptions


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    reasoning_opened: bool  # the template's text ends inside a reasoning block


def request_options(server: ChatOptions, template_kwargs: dict[str, Any] | None) -> ChatOptions:
    """The server's chat options with a request's chat_template_kwargs over them."""
    return ChatOptions(server.system_prompt, {**server.template_kwargs, **(template_kwargs or {})})


def chat_prompt(messages: list[dict[str, str]], tokenizer: Any, options: ChatOptions,
                model: str) -> ChatPrompt:
    """The prompt's token ids; ValueError naming the model where its template refuses the
    messages or options (a system message to a template without that role, say)."""
    if has_chat_template(tokenizer):
        text = chat_text(tokenizer, messages, options, model)
        # as apply_chat_template tokenizes: the template's text holds the special tokens
        return ChatPrompt(tokenizer.encode(text, add_special_tokens=False), opens_reasoning(text))
    # a model without a chat template (the tiny test models): role-tagged lines
    text = "".join(f"{m['role']}: {m['content']}\n" for m in with_system(messages, options))
    return ChatPrompt(tokenizer.encode(text + "assistant:"), False)
