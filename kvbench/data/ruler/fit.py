"""Fitting a sample to a length (the caller's token count, searched), and the random draws of
RULER's generators (niah.py's generate_random_*, wonderwords' lists)."""
from __future__ import annotations

import random
import uuid
from functools import lru_cache
from typing import Any, Callable

from kvbench.data.ruler.tasks import RulerSample, TaskSpec


# --------------------------------------------------------------------------------------------
# Fitting


class Fit:
    """Measures candidate samples against the token budget (prompt only: length less
    tokens_to_generate)."""

    def __init__(self, spec: TaskSpec, index: int, length: int, budget: int,
                 count_tokens: Callable[[RulerSample], int]):
        self.spec, self.index, self.length, self.budget = spec, index, length, budget
        self.count_tokens = count_tokens

    def sample(self, context: str, question: str, answer_prefix: str, references, depths=(),
               queries=()):
        return RulerSample(self.spec.name, self.index, context, question, answer_prefix,
                           tuple(references), self.spec.tokens_to_generate, tuple(depths),
                           tuple(queries))

    def tokens(self, sample: RulerSample) -> int:
        return int(self.count_tokens(sample))

    def smallest(self, tokens: int) -> None:
        if tokens > self.budget:
            raise ValueError(
                f"length {self.length} is too small for {self.spec.name}: its smallest prompt"
                f" takes {tokens} tokens, plus {self.spec.tokens_to_generate} to generate")

    def search(self, build: Callable[[int], RulerSample], lo: int, top: int, rate: float,
               t_lo: int | None = None) -> tuple[int, int]:
        """The largest size in [lo, top] whose sample fits, and its tokens."""
        if t_lo is None:
            t_lo = self.tokens(build(lo))
            self.smallest(t_lo)
        return largest(lambda s: self.tokens(build(s)), lo, t_lo, top, self.budget, rate)

    def done(self, sample: RulerSample, tokens: int, why: str = "") -> RulerSample:
        total = tokens + self.spec.tokens_to_generate
        if total < 0.99 * self.length:
            raise ValueError(f"{self.spec.name}: could fill only {total} of {self.length} tokens"
                             + (f" ({why})" if why else ""))
        return sample


def largest(measure: Callable[[int], int], lo: int, t_lo: int, top: int, budget: int,
             rate: float) -> tuple[int, int]:
    """The largest s in [lo, top] with measure(s) <= budget, given measure(lo) = t_lo <= budget.
    The token count grows about linearly with s (`rate` tokens a step, a first guess): a first
    step by the rate, then interpolation inside the bracket (bisection if that stalls). A handful
    of measures; the answer is always a measured fit even where the growth is not monotone."""
    hi = t_hi = None
    stalls = 0
    while lo < top and (hi is None or hi - lo > 1):
        span = None if hi is None else hi - lo
        if hi is None:
            x = min(top, lo + max(1, int((budget - t_lo) / max(rate, 1e-6))))
        elif stalls >= 2 or t_hi <= t_lo:
            x = (lo + hi) // 2
        else:
            x = min(max(lo + int((budget - t_lo) * (hi - lo) / (t_hi - t_lo)), lo + 1), hi - 1)
        t = measure(x)
        if t <= budget:
            if t > t_lo:
                rate = (t - t_lo) / (x - lo)
            lo, t_lo = x, t
        else:
            hi, t_hi = x, t
        stalls = stalls + 1 if span is not None and hi is not None and hi - lo > span // 2 else 0
    return lo, t_lo


def restored(state: Any) -> random.Random:
    r = random.Random()
    r.setstate(state)
    return r


def texts(template: str, answer_prefix: str, **fills: Any) -> tuple[str, str, str]:
    """(text before the haystack, text after it, answer prefix) of a RULER template."""
    head, tail = template.split("{context}")
    return head.format(**fills), tail.format(**fills), answer_prefix.format(**fills)


# --------------------------------------------------------------------------------------------
# Draws (niah.py's generate_random_*)


@lru_cache(maxsize=None)
def _wonderwords(name: str) -> tuple[str, ...]:
    """A wonderwords word list as RULER loads it (random_word._get_words_from_text_file)."""
    try:
        from wonderwords import random_word
    except ImportError as exc:  # pragma: no cover - a dependency of kvbench
        raise ValueError("RULER's words come from the wonderwords package: pip install"
                         " wonderwords") from exc
    return tuple(random_word._get_words_from_text_file(name))


@lru_cache(maxsize=None)
def key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(sorted(set(_wonderwords("adjectivelist.txt")))),
            tuple(sorted(set(_wonderwords("nounlist.txt")))))


@lru_cache(maxsize=None)
def cwe_words(seed: Any) -> tuple[str, ...]:
    # common_words_extraction.py: nouns + adjs + verbs, deduplicated, sorted, fixed-seed shuffle
    words = sorted(set(_wonderwords("nounlist.txt") + _wonderwords("adjectivelist.txt")
                       + _wonderwords("verblist.txt")))
    random.Random(seed).shuffle(words)
    return tuple(words)


def draw(rng: random.Random, kind: str) -> str:
    if kind == "numbers":  # 7 digits
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        # RULER: random.choice(sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns)));
        # an adjective and a noun drawn apiece is the same draw without 6 million strings
        adjs, nouns = key_words()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")
