"""The request bodies `kvbench serve` accepts (pydantic), one per endpoint: every field a request
may set; any other is refused with 400, never ignored. The README's "API surface" table lists
them."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 5
MAX_STOPS = 4  # OpenAI's limit on stop sequences


# A field sent as null counts as not sent, as OpenAI and vLLM take it (the app drops nulls).
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (guidellm asks for it)


class CommonBody(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[int, float] = Field(default_factory=dict)  # token id -> -100 .. 100
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=-2 ** 63, lt=2 ** 64)  # what torch's generator takes
    n: int = 1
    stop: str | list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)  # vLLM's
    user: str | None = None  # an end-user id for the provider's records: kvbench keeps none
    ignore_eos: bool = False
    return_token_ids: bool = False

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionBody(CommonBody):
    # a batch of prompts (strings or token-id lists, as lm-eval sends) gets a choice per prompt
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int = 1
    # kvbench's: the prompt tokens prefilled (and compressed); the rest are fed through the cache
    # one at a time and scored (default: half of a scored prompt, else all of it)
    prefill_tokens: int | None = Field(None, ge=1)

    @property
    def scores_prompt(self) -> bool:
        """echo with logprobs: every prompt token's logprob comes back."""
        return self.echo and self.logprobs is not None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart]  # a string, or text parts (as guidellm sends)

    def as_text(self) -> dict[str, str]:
        content = self.content
        if not isinstance(content, str):
            content = "".join(part.text for part in content)
        return {"role": self.role, "content": content}


class ResponseFormat(_Strict):
    type: str  # "text" (OpenAI's default) only: the app refuses structured output by name
    json_schema: dict | None = None


class ChatBody(CommonBody):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    # vLLM's: the chat template's extra arguments (Qwen3's enable_thinking), over the server's
    # --chat-template-kwargs key by key
    chat_template_kwargs: dict[str, Any] | None = None

    def reply_limit(self) -> tuple[str, int | None]:
        """(the field that sets the reply's length, its value): max_completion_tokens, which
        replaces max_tokens, wherever it is sent."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens
