"""What the engine tells whoever submitted a request (kvbench.serve.engine's emit callback), and
the scoring of tokens under the logits of a forward."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Token:
    """One token; its logprob and the top (id, logprob) pairs when the request asked (none for a
    prompt's first token: nothing comes before it)."""

    id: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Scored:
    """Every prompt token, each with its logprob given the tokens before it: sent once the whole
    prompt has been scored, before the first generated token."""

    tokens: list[Token]


@dataclass
class Finished:
    reason: str  # "length" | "stop"
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Failed:
    status: int  # the HTTP status the request gets (503: no room in time; 500: the engine failed)
    message: str
    retry_after_s: int | None = None  # a 503 that may succeed later says when to try again


Event = Token | Scored | Finished | Failed


def scored(logits: torch.Tensor, targets: list[int], top: int) -> list[Token]:
    """Token(target, its logprob, the `top` likeliest (id, logprob)) under each row of `logits`
    (rows, vocab): the model's own log-softmax, before any sampling setting."""
    if not targets:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(targets)[:, None])[:, 0].tolist()
    if not top:
        return [Token(t, lp) for t, lp in zip(targets, chosen)]
    best = torch.topk(logprobs, top, dim=-1)
    return [Token(t, lp, list(zip(ids, lps))) for t, lp, ids, lps
            in zip(targets, chosen, best.indices.tolist(), best.values.tolist())]


class PromptRecorder:
    """The session as kvbench.models.session.prefill drives it, scoring every prompt token from
    the prefill's own forwards (each position's logits, not the last alone); the probe's forward
    after the prompt passes through unrecorded. `tokens` holds the prompt's first token and each
    later one scored; the token after the prompt is scored from the logits prefill returns."""

    def __init__(self, session, prompt: list[int], top: int):
        self.session, self.prompt, self.top = session, prompt, top
        self.tokens = [Token(prompt[0])]
        self.fed = 0

    def begin_prompt(self, cache, tokens: int) -> None:
        self.session.begin_prompt(cache, tokens)

    def trim(self, cache, n: int) -> None:
        self.session.trim(cache, n)

    def end_prefill(self, cache) -> float:
        return self.session.end_prefill(cache)

    def step(self, ids: list[int], cache, last_only: bool = False) -> tuple[torch.Tensor, float]:
        if self.fed >= len(self.prompt):  # the probe, taken back after this forward
            return self.session.step(ids, cache, last_only)
        logits, seconds = self.session.step(ids, cache)
        start, self.fed = self.fed, self.fed + len(ids)
        targets = self.prompt[start + 1 : self.fed + 1]  # what each position predicts
        self.tokens += scored(logits[: len(targets)], targets, self.top)
        return logits[-1:], seconds
