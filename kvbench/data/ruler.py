"""NVIDIA RULER's synthetic tasks, generated offline and faithful to NVIDIA/RULER.

Upstream (github.com/NVIDIA/RULER): the generators in scripts/data/synthetic/ (niah.py,
variable_tracking.py, common_words_extraction.py, freq_words_extraction.py, qa.py), the task
templates, answer prefixes and tokens_to_generate in scripts/data/synthetic/constants.py, the 13
task configurations in scripts/synthetic.yaml, and the answer-prefix handling of
scripts/data/prepare.py (the answer prefix is appended to the template, then split off again).

What we do differently, and why (each is repeated where it happens):
- Fitting. RULER binary-searches a haystack unit count against its tokenizer; we search against
  the caller's `count_tokens` (the prompt as the caller renders it: chat template, answer prefix)
  so that prompt + tokens_to_generate lands in [0.99 * length, length]. Where RULER's unit is
  coarser than 1% of a short length we fit finer: the noise haystack by sentences of its
  5-sentence repeat (the last repeat is cut short), the `needle` haystack by a last distractor
  line cut to a prefix, qa by one more distractor document cut to its first words. fwe is fitted
  with its tokens_to_generate counted (RULER's fwe leaves it out and can exceed the length).
- Randomness. One `random.Random` per sample, seeded by (seed, task, index), so a sample does not
  depend on the others or on which tasks run; draws whose result RULER makes depend on the
  haystack size (the niah query, the cwe/qa word and document draws) are made in an order, or as
  a prefix of one shuffle, that does not move with the size being searched (same distributions).
  RULER's fixed-seed shuffles (`random.Random(args.random_seed).shuffle(...)`) stay fixed-seed:
  `random.Random(seed)`.
- Essays. RULER's essay haystack is Paul Graham's essays (not shipped): the caller passes any
  long text, repeated when short as RULER repeats its own. nltk's sent_tokenize (a download) is
  replaced by a regex sentence splitter.
- Words. niah word keys are drawn as an adjective and a noun (uniform over RULER's sorted list of
  every "adj-noun", which we do not build: 6 million strings); cwe cannot go past wonderwords'
  8,166 words (RULER then falls back to a word list it downloads).
- Few-shot examples (cwe, vt) are plain task text in the user turn: RULER wraps them in the model
  template too, which only the caller knows.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import string
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

# --------------------------------------------------------------------------------------------
# Tasks (scripts/synthetic.yaml; tokens_to_generate from scripts/data/synthetic/constants.py;
# metrics from scripts/eval/synthetic/constants.py)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    tokens_to_generate: int  # RULER's for that task
    metric: str  # "all" (string_match_all) or "part" (string_match_part)
    haystack: str  # "noise", "essay", "needle", "none", "squad", "hotpotqa"
    needs_essay: bool  # True where RULER's haystack is Paul Graham essays
    needs_qa: str | None  # "squad" | "hotpotqa" | None


@dataclass(frozen=True)
class _Niah:  # scripts/synthetic.yaml, task: niah
    type_haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int
    num_needle_v: int
    num_needle_q: int


_NIAH = {
    "niah_single_1": _Niah("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": _Niah("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": _Niah("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": _Niah("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": _Niah("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": _Niah("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": _Niah("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": _Niah("essay", "words", "numbers", 1, 1, 4),
}
_VT = {"num_chains": 1, "num_hops": 4}  # vt
_CWE = {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}  # cwe (num_fewshot: default)
_FWE = {"alpha": 2.0, "coded_wordlen": 6}  # fwe (coded_wordlen: freq_words_extraction's default)


def _task_table() -> dict[str, TaskSpec]:
    tasks = {name: TaskSpec(name, 128, "all", cfg.type_haystack, cfg.type_haystack == "essay", None)
             for name, cfg in _NIAH.items()}
    tasks["vt"] = TaskSpec("vt", 30, "all", "noise", False, None)
    tasks["cwe"] = TaskSpec("cwe", 120, "all", "none", False, None)
    tasks["fwe"] = TaskSpec("fwe", 50, "all", "none", False, None)
    tasks["qa_1"] = TaskSpec("qa_1", 32, "part", "squad", False, "squad")
    tasks["qa_2"] = TaskSpec("qa_2", 32, "part", "hotpotqa", False, "hotpotqa")
    return tasks


TASKS: dict[str, TaskSpec] = _task_table()
OFFLINE_TASKS: tuple[str, ...] = tuple(name for name, spec in TASKS.items() if spec.needs_qa is None)

# scripts/data/synthetic/constants.py, verbatim (including vt's "assgined")
_NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to"
    " memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all"
    " the special magic {type_needle_v} for {query} mentioned in the provided text?")
_NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
_VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text"
    " above.")
_VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v}"
              " variables are assgined the value {query}, they are: ")
_CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others."
    " Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common"
    " words in the above list?")
_CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
_FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three"
    " most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation."
    " Please ignore the dots '....'. What are the three most frequently appeared words in the"
    " above coded text?")
_FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
_QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output"
    " any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question"
    " based on the given documents. Only give me the answer and do not output any other words."
    "\n\nQuestion: {query}")
_QA_PREFIX = " Answer:"

# niah.py / variable_tracking.py
_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_NOISE_SENTENCES = tuple(s + "." for s in _NOISE.removesuffix(".").split(". "))
_DEPTHS = [round(100 * i / 39) for i in range(40)]  # np.round(np.linspace(0, 100, num=40))
_DOCUMENT = "Document {i}:\n{document}"  # qa.py's DOCUMENT_PROMPT


# --------------------------------------------------------------------------------------------
# Samples


@dataclass(frozen=True)
class RulerSample:
    task: str
    index: int
    context: str  # RULER's input up to and including the haystack (what "compress: context" compresses)
    question: str  # the rest of RULER's input; context + question == RULER's input
    answer_prefix: str  # RULER's answer prefix (goes after the chat template's assistant start)
    references: tuple[str, ...]
    tokens_to_generate: int
    depths: tuple[float, ...] = ()  # niah: the needles' depth percents as placed, in text order


@dataclass(frozen=True)
class QARecord:
    """One question of qa.py's read_squad / read_hotpotqa. `docs` is the deduplicated, sorted
    document pool of the whole file (one tuple shared by every record); `context` indexes the
    documents the question always gets, `more_context` (SQuAD) the article's other paragraphs,
    which RULER draws as distractors before documents of other articles."""

    query: str
    outputs: tuple[str, ...]
    context: tuple[int, ...]
    more_context: tuple[int, ...]
    docs: tuple[str, ...] = field(repr=False, compare=False)


def make_sample(task: str, index: int, *, length: int, count_tokens: Callable[[RulerSample], int],
                seed: int, essay: str | None = None, qa_records: list[QARecord] | None = None,
                depth: float | None = None) -> RulerSample:
    """A sample whose prompt (count_tokens(sample), as the caller renders it: chat template,
    answer prefix) plus its tokens_to_generate is <= length and >= 0.99 * length. Deterministic
    in (task, index, seed, length, count_tokens). `depth` (0-100) fixes the needle's depth for the
    single-needle niah tasks (the NIAH grid); else it is drawn as RULER does. About 10-20 calls of
    count_tokens a sample."""
    if task not in TASKS:
        close = [t for t in TASKS if t.split("_")[0] == task.split("_")[0]]
        raise ValueError(f"unknown RULER task {task!r}; known: {', '.join(TASKS)}"
                         + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    spec = TASKS[task]
    if index < 0:
        raise ValueError(f"{task}: sample index must be >= 0, got {index}")
    if spec.needs_essay and not (essay and essay.strip()):
        raise ValueError(f"{task} needs an essay text for its haystack (RULER uses Paul Graham's"
                         " essays, which kvbench does not ship): pass essay=<any long text>")
    if spec.needs_qa and not qa_records:
        name = {"squad": "SQuAD", "hotpotqa": "HotpotQA"}[spec.needs_qa]
        file = {"squad": "SQuAD v2 dev JSON file (dev-v2.0.json)",
                "hotpotqa": "HotpotQA dev distractor JSON file (hotpot_dev_distractor_v1.json)"}
        raise ValueError(f"{task} needs {name}: set qa_records=read_qa(path, {spec.needs_qa!r})"
                         f" with a local {file[spec.needs_qa]}")
    if depth is not None:
        cfg = _NIAH.get(task)
        if cfg is None or max(cfg.num_needle_k, cfg.num_needle_q) * cfg.num_needle_v != 1:
            raise ValueError(f"depth is for the single-needle niah tasks, not {task}")
        if not 0 <= depth <= 100:
            raise ValueError(f"depth is a percent in [0, 100], got {depth}")
    budget = length - spec.tokens_to_generate
    if budget <= 0:
        raise ValueError(f"length {length} is too small for {task}: it leaves no room beside its"
                         f" {spec.tokens_to_generate} tokens to generate")
    fit = _Fit(spec, index, length, budget, count_tokens)
    rng = random.Random(f"{seed}:{task}:{index}")
    if task in _NIAH:
        return _niah(fit, _NIAH[task], rng, seed, essay, depth)
    if task == "vt":
        return _vt(fit, rng, seed)
    if task == "cwe":
        return _cwe(fit, rng, seed)
    if task == "fwe":
        return _fwe(fit, rng, seed)
    return _qa(fit, rng, seed, qa_records)


# --------------------------------------------------------------------------------------------
# Fitting


class _Fit:
    """Measures candidate samples against the token budget (prompt only: length less
    tokens_to_generate)."""

    def __init__(self, spec: TaskSpec, index: int, length: int, budget: int,
                 count_tokens: Callable[[RulerSample], int]):
        self.spec, self.index, self.length, self.budget = spec, index, length, budget
        self.count_tokens = count_tokens

    def sample(self, context: str, question: str, answer_prefix: str, references, depths=()):
        return RulerSample(self.spec.name, self.index, context, question, answer_prefix,
                           tuple(references), self.spec.tokens_to_generate, tuple(depths))

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
        return _largest(lambda s: self.tokens(build(s)), lo, t_lo, top, self.budget, rate)

    def done(self, sample: RulerSample, tokens: int, why: str = "") -> RulerSample:
        total = tokens + self.spec.tokens_to_generate
        if total < 0.99 * self.length:
            raise ValueError(f"{self.spec.name}: could fill only {total} of {self.length} tokens"
                             + (f" ({why})" if why else ""))
        return sample


def _largest(measure: Callable[[int], int], lo: int, t_lo: int, top: int, budget: int,
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


def _restored(state: Any) -> random.Random:
    r = random.Random()
    r.setstate(state)
    return r


def _texts(template: str, answer_prefix: str, **fills: Any) -> tuple[str, str, str]:
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
def _key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(sorted(set(_wonderwords("adjectivelist.txt")))),
            tuple(sorted(set(_wonderwords("nounlist.txt")))))


@lru_cache(maxsize=None)
def _cwe_words(seed: Any) -> tuple[str, ...]:
    # common_words_extraction.py: nouns + adjs + verbs, deduplicated, sorted, fixed-seed shuffle
    words = sorted(set(_wonderwords("nounlist.txt") + _wonderwords("adjectivelist.txt")
                       + _wonderwords("verblist.txt")))
    random.Random(seed).shuffle(words)
    return tuple(words)


def _draw(rng: random.Random, kind: str) -> str:
    if kind == "numbers":  # 7 digits
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        # RULER: random.choice(sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns)));
        # an adjective and a noun drawn apiece is the same draw without 6 million strings
        adjs, nouns = _key_words()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")


# --------------------------------------------------------------------------------------------
# niah (scripts/data/synthetic/niah.py)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def _sentences(text: str) -> list[str]:
    """RULER splits the essay with nltk's sent_tokenize (a download); a regex splitter instead:
    a sentence ends at . ! or ? (a closing quote or bracket may follow) before white space."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


@lru_cache(maxsize=4)
def _essay_words(essay: str) -> tuple[str, ...]:
    return tuple(re.sub(r"\s+", " ", essay).strip().split(" "))  # niah.py's essay haystack


def _niah(fit: _Fit, cfg: _Niah, rng: random.Random, seed: int, essay: str | None,
          depth: float | None) -> RulerSample:
    num_k = max(cfg.num_needle_k, cfg.num_needle_q)
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(_draw(rng, cfg.type_needle_k))
        value = []
        for _ in range(cfg.num_needle_v):
            value.append(_draw(rng, cfg.type_needle_v))
            needles.append(_NEEDLE.format(type_needle_v=cfg.type_needle_v, key=keys[-1],
                                          value=value[-1]))
        values.append(value)
    random.Random(seed).shuffle(needles)  # RULER: random.Random(args.random_seed).shuffle
    # RULER draws the query after the haystack; drawn first (the same draw) it stays put while
    # the haystack size is searched
    indices = rng.sample(range(num_k), cfg.num_needle_q)
    queries = [keys[i] for i in indices]
    answers = [a for i in indices for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix, type_v = _NIAH_TEMPLATE, _NIAH_PREFIX, cfg.type_needle_v
    if cfg.num_needle_q * cfg.num_needle_v == 1:  # niah.py, on template + answer prefix
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template, prefix = template.replace(old, new), prefix.replace(old, new)
        type_v = type_v[:-1]
    head, question, answer_prefix = _texts(template, prefix, type_needle_v=type_v, query=query)
    state = rng.getstate()

    def finish(haystack: str, depths: list[float]) -> RulerSample:
        return fit.sample(head + haystack, question, answer_prefix, answers,
                          [round(d, 2) for d in sorted(depths)])

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
                drawn = _restored(state).sample(_DEPTHS, len(needles))
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
            full, part = divmod(n, len(_NOISE_SENTENCES))
            units = [_NOISE] * full + ([" ".join(_NOISE_SENTENCES[:part])] if part else [])
            return place(units, _restored(state))

        n, tokens = fit.search(build, len(needles), 2 * fit.budget, 5.0)
        return fit.done(build(n), tokens)

    # "needle": the haystack is distractor needles, one a line. A line is 20 to 50 tokens (over
    # 1% of a short length): we fit whole lines, then one more distractor line cut to a prefix
    # (characters) at the end of the haystack.
    def lines(n: int, cut: int) -> RulerSample:
        r = _restored(state)
        units = [_NEEDLE.format(type_needle_v=cfg.type_needle_v, key=_draw(r, cfg.type_needle_k),
                                value=_draw(r, cfg.type_needle_v)) for _ in range(n)]
        if cut:
            extra = _NEEDLE.format(type_needle_v=cfg.type_needle_v,
                                   key=_draw(r, cfg.type_needle_k),
                                   value=_draw(r, cfg.type_needle_v))
            units.append(extra[:cut].rstrip())
        return place(units, r)

    n, tokens = fit.search(lambda n: lines(n, 0), len(needles), fit.budget, 25.0)
    r = _restored(state)
    for _ in range(n):
        _draw(r, cfg.type_needle_k), _draw(r, cfg.type_needle_v)
    longest = len(_NEEDLE.format(type_needle_v=cfg.type_needle_v, key=_draw(r, cfg.type_needle_k),
                                 value=_draw(r, cfg.type_needle_v))) - 1
    cut, tokens = fit.search(lambda c: lines(n, c), 0, longest, 0.3, t_lo=tokens)
    return fit.done(lines(n, cut), tokens)


# --------------------------------------------------------------------------------------------
# vt (scripts/data/synthetic/variable_tracking.py)


def _chains(rng: random.Random, num_chains: int, num_hops: int, is_icl: bool):
    letters = 3 if is_icl else 5
    names: list[str] = []
    while len(names) < num_chains * (num_hops + 1):  # RULER redraws until they are distinct
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    variables, chains = [], []
    for i in range(0, len(names), num_hops + 1):
        these = names[i:i + num_hops + 1]
        variables.append(these)
        # np.random.randint(10000, 99999): the upper bound is excluded
        value = "12345" if is_icl else str(rng.randint(10000, 99998))
        chain = [f"VAR {these[0]} = {value}"]
        chain += [f"VAR {these[j + 1]} = VAR {these[j]} " for j in range(num_hops)]
        chains.append(chain)
    return variables, chains


def _noise_with_chains(n: int, chains: list[list[str]], r: random.Random) -> str:
    """`n` sentences of noise (the last repeat cut short, see _niah), the chains' lines inserted
    in order at random places, as variable_tracking.py does for its noise haystack."""
    full, part = divmod(n, len(_NOISE_SENTENCES))
    units = [_NOISE] * full + ([" ".join(_NOISE_SENTENCES[:part])] if part else [])
    for chain in chains:
        spots = sorted(r.sample(range(len(units)), len(chain)))
        for j, spot in enumerate(spots):
            units.insert(spot + j, chain[j])
    return "\n".join(units).replace(". \n", ".\n")


def _vt(fit: _Fit, rng: random.Random, seed: int) -> RulerSample:
    num_chains, num_hops = _VT["num_chains"], _VT["num_hops"]
    num_v = num_hops + 1
    icl = _vt_icl(fit, seed, num_chains, num_hops)
    # randomize_icl: fresh names for the example's answer variables and value, per sample
    for item in icl.strip().split()[-num_hops - 1:]:
        icl = icl.replace(item, "".join(rng.choices(string.ascii_uppercase, k=len(item))))
    icl = icl.replace("12345", str(rng.randint(10000, 99998)))
    variables, chains = _chains(rng, num_chains, num_hops, is_icl=False)
    value = chains[0][0].split("=")[-1].strip()
    head, question, answer_prefix = _texts(_VT_TEMPLATE, _VT_PREFIX, query=value, num_v=num_v)
    # the example goes before the task text, a newline between (variable_tracking.py's cutoff)
    head = icl + "\n" + head
    state = rng.getstate()

    def build(n: int) -> RulerSample:
        return fit.sample(head + _noise_with_chains(n, chains, _restored(state)), question,
                          answer_prefix, variables[0])

    least = (num_hops + 1) * len(_NOISE_SENTENCES) - (len(_NOISE_SENTENCES) - 1)  # 5 units
    n, tokens = fit.search(build, least, 2 * fit.budget, 5.0)
    return fit.done(build(n), tokens)


def _vt_icl(fit: _Fit, seed: int, num_chains: int, num_hops: int) -> str:
    """variable_tracking.py's in-context example: one sample of the task itself (3-letter names,
    value 12345) filled to 500 tokens of its text, RULER's tokens counted without a model
    template (here: the caller's count less that of an empty prompt), with its answer appended.
    RULER makes it once per dataset from its seed; so do we (the same for every index)."""
    r0 = random.Random(f"{seed}:vt:icl")
    variables, chains = _chains(r0, num_chains, num_hops, is_icl=True)
    num_v = min(10, num_hops) + 1
    state = r0.getstate()
    overhead = fit.tokens(fit.sample("", "", "", ()))

    def text(n: int) -> str:  # n whole repeats, as RULER
        context = _noise_with_chains(n * len(_NOISE_SENTENCES), chains, _restored(state))
        return _VT_TEMPLATE.format(context=context, query="12345") + _VT_PREFIX.format(
            num_v=num_v, query="12345")

    def tokens(n: int) -> int:
        return fit.tokens(fit.sample(text(n), "", "", ())) - overhead

    least = num_hops + 1
    n, _ = _largest(tokens, least, tokens(least), 500, 500, 25.0)
    return text(n) + " " + " ".join(variables[0]) + "\n"


# --------------------------------------------------------------------------------------------
# cwe (scripts/data/synthetic/common_words_extraction.py)


def _cwe(fit: _Fit, rng: random.Random, seed: int) -> RulerSample:
    words = _cwe_words(seed)
    num_cw = _CWE["num_cw"]
    # RULER: below 4096 tokens, 6 and 1 repeats (example: 20 words, 3 and 1); else freq_cw and
    # freq_ucw (example: 40 words, 10 and 3)
    if fit.length < 4096:
        example, repeats = (20, 3, 1), (6, 1)
    else:
        example, repeats = (40, 10, 3), (_CWE["freq_cw"], _CWE["freq_ucw"])

    def word_list(chosen, common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
        common, uncommon = list(chosen[:num_cw]), list(chosen[num_cw:])
        listed = common * common_repeats + uncommon * uncommon_repeats
        random.Random(seed).shuffle(listed)  # RULER: random.Random(args.random_seed).shuffle
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

    shots = []
    for _ in range(_CWE["num_fewshot"]):
        ctx, answer = word_list(rng.sample(words, example[0]), example[1], example[2])
        shots.append(_CWE_TEMPLATE.format(context=ctx) + _CWE_PREFIX + " "
                     + " ".join(f"{i + 1}. {w}" for i, w in enumerate(answer)))
    head, question, answer_prefix = _texts(_CWE_TEMPLATE, _CWE_PREFIX)
    head = "\n".join(shots) + "\n" + head
    # RULER's random.sample(words, num_words) for each size tried; a prefix of one shuffle is
    # the same draw and does not change with the size
    order = list(words)
    rng.shuffle(order)

    def build(n: int) -> RulerSample:
        ctx, common = word_list(order[:n], *repeats)
        return fit.sample(head + ctx, question, answer_prefix, common)

    n, tokens = fit.search(build, num_cw + 1, len(order), 6.0 * repeats[1])
    return fit.done(build(n), tokens, f"wonderwords has {len(order)} words; RULER goes on with a"
                    " downloaded word list kvbench does not ship")


# --------------------------------------------------------------------------------------------
# fwe (scripts/data/synthetic/freq_words_extraction.py; no in-context example there)


def _fwe(fit: _Fit, rng: random.Random, seed: int) -> RulerSample:
    alpha, wordlen = _FWE["alpha"], _FWE["coded_wordlen"]
    vocab_size = fit.length // 50
    if vocab_size < 4:
        raise ValueError(f"length {fit.length} is too small for fwe (its vocabulary is"
                         " length // 50 words and needs 4)")
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=wordlen)) for _ in range(vocab_size)]
    while len(set(vocab)) < vocab_size:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=wordlen)))
    vocab = sorted(set(vocab))
    random.Random(seed).shuffle(vocab)  # RULER: random.Random(args.random_seed).shuffle
    vocab[0] = "..."  # treat the top ranked as noise
    zeta = _zeta(alpha)
    head, question, answer_prefix = _texts(_FWE_TEMPLATE, _FWE_PREFIX)

    def counts(n: int) -> list[int]:  # RULER's: num_words * k^-alpha / zeta(alpha), floored
        return [int(n * (k ** -alpha) / zeta) for k in range(1, len(vocab) + 1)]

    def build(total: int) -> RulerSample:
        """`total` coded words. RULER's sizes (its num_words n) move all the counts of a step
        together, up to 20 tokens at once where n * k^-2 / zeta(2) is whole for several k; we
        take RULER's largest n within `total`, then the first words (by rank) of its step to
        n + 1: counts between RULER's two, in the same rank order."""
        lo, hi = 0, 2 * total + 2
        while lo < hi:  # the largest n with sum(counts(n)) <= total
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if sum(counts(mid)) <= total else (lo, mid - 1)
        now, step = counts(lo), counts(lo + 1)
        extra = total - sum(now)
        for k in range(len(now)):
            if extra and step[k] > now[k]:
                now[k], extra = now[k] + 1, extra - 1
        sampled = [w for w, c in zip(vocab, now) for _ in range(c)]
        random.Random(seed).shuffle(sampled)  # RULER: random.Random(args.random_seed).shuffle
        return fit.sample(head + " ".join(sampled), question, answer_prefix, vocab[1:4])

    # RULER fits without tokens_to_generate and in steps of length // 32 words; we fit the
    # whole budget word by word
    n, tokens = fit.search(build, 10, 4 * fit.budget, 2.0)
    return fit.done(build(n), tokens)


def _zeta(alpha: float) -> float:
    """Riemann zeta (scipy.special.zeta in RULER): exact for 2, else summed with a tail term."""
    if alpha == 2.0:
        return math.pi ** 2 / 6
    terms = 100_000
    return sum(k ** -alpha for k in range(1, terms)) + terms ** (1 - alpha) / (alpha - 1)


# --------------------------------------------------------------------------------------------
# qa (scripts/data/synthetic/qa.py)


def _qa(fit: _Fit, rng: random.Random, seed: int, records: list[QARecord]) -> RulerSample:
    # RULER takes the file's questions in order (QAS[index]); we wrap around past the end
    record = records[fit.index % len(records)]
    pool = record.docs
    head, question, answer_prefix = _texts(_QA_TEMPLATE, _QA_PREFIX, query=record.query)
    # qa.py: the question's documents, then its article's other paragraphs, then other
    # documents, each drawn with random.sample; a prefix of shuffles is the same draw
    more = list(record.more_context)
    rng.shuffle(more)
    taken = set(record.context) | set(more)
    others = [i for i in range(len(pool)) if i not in taken]
    rng.shuffle(others)
    order = list(record.context) + more + others

    def build(n: int, words: int = 0) -> RulerSample:
        docs = [pool[i] for i in order[:n]]
        if words:
            docs.append(" ".join(pool[order[n]].split(" ")[:words]))
        random.Random(seed).shuffle(docs)  # RULER: random.Random(args.random_seed).shuffle
        context = "\n\n".join(_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(docs))
        return fit.sample(head + context, question, answer_prefix, record.outputs)

    # A document is 100-200 tokens (over 1% of a short length): whole documents first, then
    # one more distractor cut to its first words
    n, tokens = fit.search(build, len(record.context), len(order), 150.0)
    if n < len(order):
        longest = len(pool[order[n]].split(" ")) - 1
        if longest > 0:
            words, tokens = fit.search(lambda w: build(n, w), 0, longest, 1.4, t_lo=tokens)
            return fit.done(build(n, words), tokens)
    return fit.done(build(n), tokens, f"the QA file has only {len(pool)} documents")


def read_qa(path_or_source: str, kind: str) -> list[QARecord]:
    """The questions of a QA file as qa.py's read_squad ("squad": SQuAD v2 dev JSON,
    dev-v2.0.json; unanswerable questions left out) or read_hotpotqa ("hotpotqa": HotpotQA dev
    distractor JSON; every listed paragraph is one of the question's documents). Documents are
    deduplicated and sorted into one pool. `path_or_source` is a JSON file, or
    "hf:<dataset>[:<config>]:<split>" read from the local `datasets` cache (rajpurkar/squad_v2,
    hotpotqa/hotpot_qa:distractor)."""
    if kind not in ("squad", "hotpotqa"):
        raise ValueError(f"QA kind must be 'squad' or 'hotpotqa', got {kind!r}")
    if path_or_source.startswith("hf:"):
        rows = _hf_rows(path_or_source)
        data = _squad_from_rows(rows) if kind == "squad" else _hotpotqa_from_rows(rows)
    else:
        path = Path(path_or_source).expanduser()
        if not path.is_file():
            raise ValueError(f"QA file {str(path)!r} does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"QA file {str(path)!r} is not JSON: {exc}") from exc
    try:
        records = _read_squad(data) if kind == "squad" else _read_hotpotqa(data)
    except (KeyError, TypeError, IndexError) as exc:
        form = "SQuAD v2 (dev-v2.0.json)" if kind == "squad" else "HotpotQA (dev distractor)"
        raise ValueError(f"{path_or_source!r} is not {form} JSON: {exc!r}") from exc
    if not records:
        raise ValueError(f"{path_or_source!r} holds no answerable question")
    return records


def _read_squad(data: dict) -> list[QARecord]:
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    where = {c: i for i, c in enumerate(docs)}
    pool = tuple(docs)
    records = []
    for d in data["data"]:
        article = [where[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            own = where[p["context"]]
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):  # SQuAD v1.1 has no such field
                    records.append(QARecord(qa["question"], tuple(a["text"] for a in qa["answers"]),
                                            (own,), tuple(i for i in article if i != own), pool))
    return records


def _read_hotpotqa(data: list) -> list[QARecord]:
    def doc(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    docs = sorted({doc(t, p) for d in data for t, p in d["context"]})
    where = {c: i for i, c in enumerate(docs)}
    pool = tuple(docs)
    return [QARecord(d["question"], (d["answer"],), tuple(where[doc(t, p)] for t, p in d["context"]),
                     (), pool) for d in data]


def _hf_rows(source: str) -> list[dict]:
    parts = source.removeprefix("hf:").split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"QA source {source!r}: expected hf:<dataset>[:<config>]:<split>")
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    # no network at run time; set before `datasets` is imported, which reads them once
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError as exc:
        raise ValueError(f"QA source {source!r} needs the datasets package") from exc
    try:
        return list(datasets.load_dataset(name, config, split=split))
    except Exception as exc:  # datasets raises many kinds for "not cached"
        raise ValueError(f"QA source {source!r} could not be read from the local datasets cache"
                         f" (kvbench reads datasets offline): {exc}") from exc


def _squad_from_rows(rows: list[dict]) -> dict:
    """rajpurkar/squad_v2 rows (title, context, question, answers{text}) in the official
    file's shape: articles by title, paragraphs by context, in the rows' order."""
    articles: dict[str, dict[str, list]] = {}
    for row in rows:
        texts = list(row["answers"]["text"])
        articles.setdefault(row["title"], {}).setdefault(row["context"], []).append(
            {"question": row["question"], "answers": [{"text": t} for t in texts],
             "is_impossible": not texts})
    return {"data": [{"title": title, "paragraphs": [{"context": c, "qas": qas}
                                                     for c, qas in paragraphs.items()]}
                     for title, paragraphs in articles.items()]}


def _hotpotqa_from_rows(rows: list[dict]) -> list:
    """hotpotqa/hotpot_qa rows (context{title, sentences}) in the official file's shape."""
    return [{"question": row["question"], "answer": row["answer"],
             "context": [[t, list(s)] for t, s in zip(row["context"]["title"],
                                                      row["context"]["sentences"])]}
            for row in rows]
