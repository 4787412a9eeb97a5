"""make_sample: one RULER sample of a task, fitted to a length (make_multikey_sample: an essay
haystack of several needles, asked one key at a time); the generators of
scripts/data/synthetic/ (variable_tracking.py, common_words_extraction.py,
freq_words_extraction.py, qa.py; niah.py's is kvbench.data.ruler.niah)."""
from __future__ import annotations

import math
import random
import string
from typing import Callable

from kvbench.data.ruler.fit import Fit, cwe_words, largest, restored, texts
from kvbench.data.ruler.niah import niah
from kvbench.data.ruler.tasks import (
    CWE, CWE_PREFIX, CWE_TEMPLATE, DOCUMENT, FWE, FWE_PREFIX, FWE_TEMPLATE, NIAH, NOISE,
    NOISE_SENTENCES, Niah, QARecord, QA_PREFIX, QA_TEMPLATE, RulerSample, TASKS, TaskSpec, VT,
    VT_PREFIX, VT_TEMPLATE,
)


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
        cfg = NIAH.get(task)
        if cfg is None or max(cfg.num_needle_k, cfg.num_needle_q) * cfg.num_needle_v != 1:
            raise ValueError(f"depth is for the single-needle niah tasks, not {task}")
        if not 0 <= depth <= 100:
            raise ValueError(f"depth is a percent in [0, 100], got {depth}")
    fit = _fit(spec, index, length, count_tokens, f" for {task}")
    rng = random.Random(f"{seed}:{task}:{index}")
    if task in NIAH:
        return niah(fit, NIAH[task], rng, seed, essay, depth)
    if task == "vt":
        return _vt(fit, rng, seed)
    if task == "cwe":
        return _cwe(fit, rng, seed)
    if task == "fwe":
        return _fwe(fit, rng, seed)
    return _qa(fit, rng, seed, qa_records)


MULTIKEY_TASK = TaskSpec("niah_keys", TASKS["niah_multikey_1"].tokens_to_generate, "all",
                         "essay", True, None)


def make_multikey_sample(index: int, *, keys: int, length: int,
                         count_tokens: Callable[[RulerSample], int], seed: int,
                         essay: str) -> RulerSample:
    """RULER's essay haystack holding `keys` needles ("One of the special magic numbers for
    {key} is: {value}.", a distinct word key and a 7-digit value each), to be asked one key at a
    time: niah_multiquery's configuration (Niah("essay", "words", "numbers", keys, 1, keys)) with
    the single-needle question. `queries` are the keys in the order to ask them (a random order
    of the needles, not their order in the text), `references` their values in that order; the
    sample's question and answer prefix ask the first (key_question). Fitted as make_sample
    fits (count_tokens of the sample with its first question, plus RULER's 128 tokens to
    generate, in [0.99 * length, length]); deterministic in (index, keys, length, seed,
    count_tokens)."""
    if keys < 1:
        raise ValueError(f"a multikey sample needs at least one key, got {keys}")
    if index < 0:
        raise ValueError(f"sample index must be >= 0, got {index}")
    if not (essay and essay.strip()):
        raise ValueError("a multikey sample needs an essay text for its haystack")
    spec = MULTIKEY_TASK
    fit = _fit(spec, index, length, count_tokens)
    rng = random.Random(f"{seed}:{spec.name}{keys}:{index}")
    return niah(fit, Niah("essay", "words", "numbers", keys, 1, keys), rng, seed, essay, None,
                one_key=True)


def _fit(spec: TaskSpec, index: int, length: int, count_tokens: Callable[[RulerSample], int],
         what: str = "") -> Fit:
    """The fitting of one sample to `length` tokens, its tokens_to_generate counted in;
    ValueError when they leave no room (`what`: " for <task>" in the message)."""
    budget = length - spec.tokens_to_generate
    if budget <= 0:
        raise ValueError(f"length {length} is too small{what}: it leaves no room beside its"
                         f" {spec.tokens_to_generate} tokens to generate")
    return Fit(spec, index, length, budget, count_tokens)


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
    """`n` sentences of noise (the last repeat cut short, as niah's), the chains' lines inserted
    in order at random places, as variable_tracking.py does for its noise haystack."""
    full, part = divmod(n, len(NOISE_SENTENCES))
    units = [NOISE] * full + ([" ".join(NOISE_SENTENCES[:part])] if part else [])
    for chain in chains:
        spots = sorted(r.sample(range(len(units)), len(chain)))
        for j, spot in enumerate(spots):
            units.insert(spot + j, chain[j])
    return "\n".join(units).replace(". \n", ".\n")


def _vt(fit: Fit, rng: random.Random, seed: int) -> RulerSample:
    num_chains, num_hops = VT["num_chains"], VT["num_hops"]
    num_v = num_hops + 1
    icl = _vt_icl(fit, seed, num_chains, num_hops)
    # randomize_icl: fresh names for the example's answer variables and value, per sample
    for item in icl.strip().split()[-num_hops - 1:]:
        icl = icl.replace(item, "".join(rng.choices(string.ascii_uppercase, k=len(item))))
    icl = icl.replace("12345", str(rng.randint(10000, 99998)))
    variables, chains = _chains(rng, num_chains, num_hops, is_icl=False)
    value = chains[0][0].split("=")[-1].strip()
    head, question, answer_prefix = texts(VT_TEMPLATE, VT_PREFIX, query=value, num_v=num_v)
    # the example goes before the task text, a newline between (variable_tracking.py's cutoff)
    head = icl + "\n" + head
    state = rng.getstate()

    def build(n: int) -> RulerSample:
        return fit.sample(head + _noise_with_chains(n, chains, restored(state)), question,
                          answer_prefix, variables[0])

    least = (num_hops + 1) * len(NOISE_SENTENCES) - (len(NOISE_SENTENCES) - 1)  # 5 units
    n, tokens = fit.search(build, least, 2 * fit.budget, 5.0)
    return fit.done(build(n), tokens)


def _vt_icl(fit: Fit, seed: int, num_chains: int, num_hops: int) -> str:
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
        context = _noise_with_chains(n * len(NOISE_SENTENCES), chains, restored(state))
        return VT_TEMPLATE.format(context=context, query="12345") + VT_PREFIX.format(
            num_v=num_v, query="12345")

    def tokens(n: int) -> int:
        return fit.tokens(fit.sample(text(n), "", "", ())) - overhead

    least = num_hops + 1
    n, _ = largest(tokens, least, tokens(least), 500, 500, 25.0)
    return text(n) + " " + " ".join(variables[0]) + "\n"


# --------------------------------------------------------------------------------------------
# cwe (scripts/data/synthetic/common_words_extraction.py)


def _cwe(fit: Fit, rng: random.Random, seed: int) -> RulerSample:
    words = cwe_words(seed)
    num_cw = CWE["num_cw"]
    # RULER: below 4096 tokens, 6 and 1 repeats (example: 20 words, 3 and 1); else freq_cw and
    # freq_ucw (example: 40 words, 10 and 3)
    if fit.length < 4096:
        example, repeats = (20, 3, 1), (6, 1)
    else:
        example, repeats = (40, 10, 3), (CWE["freq_cw"], CWE["freq_ucw"])

    def word_list(chosen, common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
        common, uncommon = list(chosen[:num_cw]), list(chosen[num_cw:])
        listed = common * common_repeats + uncommon * uncommon_repeats
        random.Random(seed).shuffle(listed)  # RULER: random.Random(args.random_seed).shuffle
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

    shots = []
    for _ in range(CWE["num_fewshot"]):
        ctx, answer = word_list(rng.sample(words, example[0]), example[1], example[2])
        shots.append(CWE_TEMPLATE.format(context=ctx) + CWE_PREFIX + " "
                     + " ".join(f"{i + 1}. {w}" for i, w in enumerate(answer)))
    head, question, answer_prefix = texts(CWE_TEMPLATE, CWE_PREFIX)
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


def _fwe(fit: Fit, rng: random.Random, seed: int) -> RulerSample:
    alpha, wordlen = FWE["alpha"], FWE["coded_wordlen"]
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
    head, question, answer_prefix = texts(FWE_TEMPLATE, FWE_PREFIX)

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


def _qa(fit: Fit, rng: random.Random, seed: int, records: list[QARecord]) -> RulerSample:
    # RULER takes the file's questions in order (QAS[index]); we wrap around past the end
    record = records[fit.index % len(records)]
    pool = record.docs
    head, question, answer_prefix = texts(QA_TEMPLATE, QA_PREFIX, query=record.query)
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
        context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(docs))
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
