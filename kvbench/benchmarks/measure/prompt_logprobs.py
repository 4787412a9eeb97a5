"""A prompt's logprobs from an OpenAI-compatible server: what the perplexity benchmark reads when
another engine's cache does the work (its `server`).

One POST /v1/completions per prompt: the prompt as token ids (OpenAI's array of tokens, so the
server reads exactly the tokens kvbench scores; text would be tokenized again, and a window cut
from a longer text can come back as other tokens), echo true, logprobs 1, max_tokens 1 (0 is
refused by some servers and means "no limit" to llama-cpp-python), temperature 0. The answer's
choices[0].logprobs.token_logprobs holds, for each prompt token, its logprob given the tokens
before it (None for the first), then the generated token's, which is ignored. A kvbench server
is also sent prefill_tokens (its extension): the tokens it prefills and compresses before scoring
the rest through its cache.
"""
from __future__ import annotations

import math
from typing import Any

REQUEST_TIMEOUT_S = 600.0  # one window: a prompt of up to a few thousand tokens on a slow CPU
TOKEN_IDS_HINT = ("the server must take the prompt as token ids (OpenAI's array of tokens);"
                  " llama-cpp-python's own server takes text only: start it as"
                  " `python -m kvbench.serve.llama_cpp` (the same arguments)")


class ScoringError(RuntimeError):
    """A server's answer that does not give the prompt's logprobs; the message says why."""


def scoring_body(ids: list[int], model: str | None,
                 prefill_tokens: int | None = None) -> dict[str, Any]:
    """The request that asks for the logprob of every token of `ids`; prefill_tokens only for
    a kvbench server (others may refuse a field they do not know)."""
    body: dict[str, Any] = {"prompt": list(ids), "echo": True, "logprobs": 1, "max_tokens": 1,
                            "temperature": 0}
    if model:
        body["model"] = model
    if prefill_tokens is not None:
        body["prefill_tokens"] = prefill_tokens
    return body


def prompt_logprobs(client: Any, url: str, ids: list[int], model: str | None = None,
                    prefill_tokens: int | None = None) -> list[float | None]:
    """The server's logprob of each token of `ids` given the tokens before it (None for the
    first), read from one echoed completion; ScoringError naming what is wrong otherwise.
    `client`: an httpx.Client."""
    response = client.post(url.rstrip("/") + "/v1/completions",
                           json=scoring_body(ids, model, prefill_tokens),
                           timeout=REQUEST_TIMEOUT_S)
    if response.status_code != 200:
        # llama-cpp-python's server refuses the ids with HTTP 500, others with 400 or 422
        hint = f"; {TOKEN_IDS_HINT}" if "prompt" in response.text else ""
        raise ScoringError(f"{url}/v1/completions answered HTTP {response.status_code}:"
                           f" {response.text[:300]}{hint}")
    return read_prompt_logprobs(response.json(), len(ids))


def read_prompt_logprobs(answer: Any, sent: int) -> list[float | None]:
    """The first `sent` echoed token logprobs of a completion answer, checked: as many as the
    tokens sent (usage.prompt_tokens too, where given: a server that adds a BOS reads another
    prompt), each a finite number but the first."""
    try:
        choice = answer["choices"][0]
        values = (choice.get("logprobs") or {}).get("token_logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ScoringError(f"the answer has no choices[0]: {str(answer)[:300]}") from None
    if not isinstance(values, list):
        raise ScoringError("the answer has no logprobs.token_logprobs: the server does not echo"
                           " a prompt's logprobs (echo with logprobs)")
    read = (answer.get("usage") or {}).get("prompt_tokens")
    if isinstance(read, int) and read != sent:
        raise ScoringError(f"the server read {read} prompt tokens where {sent} were sent (does"
                           " it add a BOS token?): its logprobs are of another prompt")
    if len(values) < sent:
        raise ScoringError(f"the server echoed {len(values)} token logprobs for a prompt of"
                           f" {sent} tokens")
    values = values[:sent]
    bad = [i for i, v in enumerate(values[1:], 1)
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        raise ScoringError(f"the echoed logprob of prompt token {bad[0]} is {values[bad[0]]!r},"
                           " not a finite number")
    return values


def continuation_nll(logprobs: list[float | None], context: int) -> float:
    """The NLL sum (nats) of the tokens after the first `context`, each given the ones before
    it: what the in-process protocol sums from its logits."""
    return -math.fsum(logprobs[context:])
