"""RULER's niah generator (scripts/data/synthetic/niah.py) and its single-needle question."""
from __future__ import annotations

import itertools
import random
import re
from functools import lru_cache

from kvbench.data.ruler.fit import Fit, draw, restored, texts
from kvbench.data.ruler.tasks import (
    DEPTHS, NEEDLE, NIAH_PREFIX, NIAH_TEMPLATE, NOISE, NOISE_SENTENCES, Niah, RulerSample,
)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def _sentences(text: str) -> list[str]:
    """RULER splits the essay with nltk's sent_tokenize (a download); a regex splitter instead:
    a sentence ends at . ! or ? (a closing quote or bracket may follow) before white space."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


@lru_cache(maxsize=4)
def _essay_words(essay: str) -> tuple[str, ...]:
    return tuple(re.sub(r"\s+", " ", essay).strip().split(" "))  # niah.py's essay haystack


def _singular(template: str, prefix: str, type_needle_v: str) -> tuple[str, str, str]:
    """niah.py's wording for one needle asked (on template + answer prefix): "A special magic
    number is", not "Some special magic numbers are"."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        template, prefix = template.replace(old, new), prefix.replace(old, new)
    return template, prefix, type_needle_v[:-1]


def key_question(key: str, type_needle_v: str = "numbers") -> tuple[str, str]:
    """(question, answer prefix) asking for one key's value in RULER's single-needle wording:
    the text after the haystack ("\nWhat is the special magic number for {key} mentioned in the
    provided text?") and " The special magic number for {key} mentioned in the provided text
    is"."""
    template, prefix, type_v = _singular(NIAH_TEMPLATE, NIAH_PREFIX, type_needle_v)
    _, question, answer_prefix = texts(template, prefix, type_needle_v=type_v, query=key)
    return question, answer_prefix


def niah(fit: Fit, cfg: Niah, rng: random.Random, seed: int, essay: str | None,
         depth: float | None, one_key: bool = False) -> RulerSample:
    """one_key: the keys distinct (redrawn on a repeat, which RULER does not do) and the
    question asks the first in query order alone (make_multikey_sample)."""
    num_k = max(cfg.num_needle_k, cfg.num_needle_q)
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(draw(rng, cfg.type_needle_k))
        while one_key and keys[-1] in keys[:-1]:
            keys[-1] = draw(rng, cfg.type_needle_k)
        value = []
        for _ in range(cfg.num_needle_v):
            value.append(draw(rng, cfg.type_needle_v))
            needles.append(NEEDLE.format(type_needle_v=cfg.type_needle_v, key=keys[-1],
                                          value=value[-1]))
        values.append(value)
    random.Random(seed).shuffle(needles)  # RULER: random.Random(args.random_seed).shuffle
    # RULER draws the query after the haystack; drawn first (the same draw) it stays put while
    # the haystack size is searched
    indices = rng.sample(range(num_k), cfg.num_needle_q)
    queries = [keys[i] for i in indices]
    answers = [a for i in indices for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix, type_v = NIAH_TEMPLATE, NIAH_PREFIX, cfg.type_needle_v
    if cfg.num_needle_q * cfg.num_needle_v == 1:  # niah.py, on template + answer prefix
        template, prefix, type_v = _singular(template, prefix, type_v)
    head, question, answer_prefix = texts(template, prefix, type_needle_v=type_v, query=query)
    if one_key:
        question, answer_prefix = key_question(queries[0], cfg.type_needle_v)
    state = rng.getstate()

    def finish(haystack: str, depths: list[float]) -> RulerSample:
        return fit.sample(head + haystack, question, answer_prefix, answers,
                          [round(d, 2) for d in sorted(depths)], queries)

    def place(units: list[str], r: random.Random) -> RulerSample:
        """noise / needle haystacks: needles go between the units (lines), as niah.py inserts
        them; `depth` puts the one needle before int(units * depth / 100) of them."""
        units = list(units)
        if depth is not None:
            spots = [int(len(units) * depth / 100)]
        else:
            spots = sorted(r.sample(range(len(units)), len(needles)), reverse=True)
        depths = [100 * spot / len(units) for spot in spots]
        for spot, needle in zip(spots, needles):
            units.insert(spot, needle)
        return finish("\n".join(units), depths)

    if cfg.type_haystack == "essay":
        words = _essay_words(essay)

        def build(n: int) -> RulerSample:
            # RULER repeats its essay when the length needs more words than it has
            text = " ".join(itertools.islice(itertools.cycle(words), n))
            sents = _sentences(text)
            if depth is not None:
                drawn = [depth]
            else:
                drawn = restored(state).sample(DEPTHS, len(needles))
            spots = sorted(int(len(sents) * (d / 100)) for d in drawn)
            bounds = [0] + spots + [len(sents)]
            parts = []
            for i in range(1, len(bounds)):
                parts.append(" ".join(sents[bounds[i - 1]:bounds[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            return finish(" ".join(parts), [100 * s / len(sents) for s in spots])

        n, tokens = fit.search(build, 10, 20 * fit.budget, 1.4)
        return fit.done(build(n), tokens)

    if cfg.type_haystack == "noise":
        # RULER's unit is the whole 5-sentence repeat (about 25 tokens, over 1% of a short
        # length): we count sentences, the last repeat cut after as many as fit
        def build(n: int) -> RulerSample:
            full, part = divmod(n, len(NOISE_SENTENCES))
            units = [NOISE] * full + ([" ".join(NOISE_SENTENCES[:part])] if part else [])
            return place(units, restored(state))

        n, tokens = fit.search(build, len(needles), 2 * fit.budget, 5.0)
        return fit.done(build(n), tokens)

    # "needle": the haystack is distractor needles, one a line. A line is 20 to 50 tokens (over
    # 1% of a short length): we fit whole lines, then one more distractor line cut to a prefix
    # (characters) at the end of the haystack.
    def lines(n: int, cut: int) -> RulerSample:
        r = restored(state)
        units = [NEEDLE.format(type_needle_v=cfg.type_needle_v, key=draw(r, cfg.type_needle_k),
                                value=draw(r, cfg.type_needle_v)) for _ in range(n)]
        if cut:
            extra = NEEDLE.format(type_needle_v=cfg.type_needle_v,
                                   key=draw(r, cfg.type_needle_k),
                                   value=draw(r, cfg.type_needle_v))
            units.append(extra[:cut].rstrip())
        return place(units, r)

    n, tokens = fit.search(lambda n: lines(n, 0), len(needles), fit.budget, 25.0)
    r = restored(state)
    for _ in range(n):
        draw(r, cfg.type_needle_k), draw(r, cfg.type_needle_v)
    longest = len(NEEDLE.format(type_needle_v=cfg.type_needle_v, key=draw(r, cfg.type_needle_k),
                                 value=draw(r, cfg.type_needle_v))) - 1
    cut, tokens = fit.search(lambda c: lines(n, c), 0, longest, 0.3, t_lo=tokens)
    return fit.done(lines(n, cut), tokens)
