"""A request the engine serves, and its next token from a forward's logits (forced or sampled)."""
from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvbench.serve.events import Event, Scored, Token, scored

# Temperatures below this sample greedily, as vLLM's (its sampling_params._SAMPLING_EPS): below
# it, logits / temperature overflow float32 and softmax has nothing to sample from.
GREEDY_BELOW = 1e-5


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_tokens: int
    emit: Callable[[Event], None]
    temperature: float = 0.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: none; k: the chosen token's and the top k
    ignore_eos: bool = False
    seed: int | None = None
    prefill_tokens: int | None = None  # None: the whole prompt
    score_prompt: bool = False  # send every prompt token's logprob (and the top `logprobs`)
    id: int = field(default_factory=itertools.count().__next__)
    queued_at: float = field(default_factory=time.monotonic)
    reserved: int = 0
    cache: Any = None
    generated: list[int] = field(default_factory=list)
    forced: deque[int] = field(default_factory=deque)  # prompt tokens still to feed and score
    prompt_scores: list[Token] = field(default_factory=list)
    next_input: int = -1  # the token the next decode step feeds
    cancelled: bool = False
    cancel_outcome: str = "cancelled"  # how totals count it: "cancelled", or "stop" (a stop string)
    generator: torch.Generator | None = None

    @property
    def prefilled(self) -> int:
        return len(self.prompt) if self.prefill_tokens is None else self.prefill_tokens


def force(request: Request, logits: torch.Tensor) -> None:
    """Score the request's next prompt token under `logits` and feed it next; once the
    whole prompt is scored, send its scores."""
    token = request.forced.popleft()
    request.next_input = token
    if request.score_prompt:
        request.prompt_scores += scored(logits[None], [token], request.logprobs or 0)
        if not request.forced:
            request.emit(Scored(request.prompt_scores))


def sample(request: Request, logits: torch.Tensor) -> Token:
    """The next token: the logits with the request's logit_bias and its presence and
    frequency penalties on the tokens generated so far (OpenAI's definitions), then greedy
    below GREEDY_BELOW, else sampled at its temperature within its top_p. Logprobs are the
    model's own, before any of these."""
    scores = logits.float().clone()
    for token_id, bias in request.logit_bias.items():
        scores[token_id] += bias
    if request.generated and (request.presence_penalty or request.frequency_penalty):
        counts = torch.bincount(torch.tensor(request.generated), minlength=len(scores))
        scores -= request.frequency_penalty * counts + request.presence_penalty * (counts > 0)
    if request.temperature < GREEDY_BELOW:
        token = int(torch.argmax(scores))
    else:
        probs = torch.softmax(scores / request.temperature, dim=-1)
        if request.top_p < 1:
            probs = nucleus(probs, request.top_p)
        token = int(torch.multinomial(probs, 1, generator=request.generator))
    if request.logprobs is None:
        return Token(token)
    return scored(logits[None], [token], request.logprobs)[0]


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` kept on the fewest most likely tokens whose mass reaches top_p (the most likely
    always), renormalised."""
    ordered, order = torch.sort(probs, descending=True)
    before = torch.cumsum(ordered, 0) - ordered  # the mass of the likelier tokens
    kept = torch.zeros_like(probs).scatter(0, order, (before < top_p).to(probs.dtype))
    kept = probs * kept
    return kept / kept.sum()
