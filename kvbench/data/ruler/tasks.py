"""RULER's tasks as kvbench generates them: their specs (scripts/synthetic.yaml), their
templates and answer prefixes (scripts/data/synthetic/constants.py, verbatim), and a sample."""
from __future__ import annotations

from dataclasses import dataclass, field



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
class Niah:  # scripts/synthetic.yaml, task: niah
    type_haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int
    num_needle_v: int
    num_needle_q: int


NIAH = {
    "niah_single_1": Niah("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": Niah("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": Niah("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": Niah("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": Niah("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": Niah("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": Niah("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": Niah("essay", "words", "numbers", 1, 1, 4),
}
VT = {"num_chains": 1, "num_hops": 4}  # vt
CWE = {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}  # cwe (num_fewshot: default)
FWE = {"alpha": 2.0, "coded_wordlen": 6}  # fwe (coded_wordlen: freq_words_extraction's default)


def _task_table() -> dict[str, TaskSpec]:
    tasks = {name: TaskSpec(name, 128, "all", cfg.type_haystack, cfg.type_haystack == "essay", None)
             for name, cfg in NIAH.items()}
    tasks["vt"] = TaskSpec("vt", 30, "all", "noise", False, None)
    tasks["cwe"] = TaskSpec("cwe", 120, "all", "none", False, None)
    tasks["fwe"] = TaskSpec("fwe", 50, "all", "none", False, None)
    tasks["qa_1"] = TaskSpec("qa_1", 32, "part", "squad", False, "squad")
    tasks["qa_2"] = TaskSpec("qa_2", 32, "part", "hotpotqa", False, "hotpotqa")
    return tasks


TASKS: dict[str, TaskSpec] = _task_table()
OFFLINE_TASKS: tuple[str, ...] = tuple(name for name, spec in TASKS.items() if spec.needs_qa is None)

# scripts/data/synthetic/constants.py, verbatim (including vt's "assgined")
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to"
    " memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all"
    " the special magic {type_needle_v} for {query} mentioned in the provided text?")
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text"
    " above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v}"
              " variables are assgined the value {query}, they are: ")
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others."
    " Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common"
    " words in the above list?")
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three"
    " most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation."
    " Please ignore the dots '....'. What are the three most frequently appeared words in the"
    " above coded text?")
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output"
    " any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question"
    " based on the given documents. Only give me the answer and do not output any other words."
    "\n\nQuestion: {query}")
QA_PREFIX = " Answer:"

# niah.py / variable_tracking.py
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = tuple(s + "." for s in NOISE.removesuffix(".").split(". "))
DEPTHS = [round(100 * i / 39) for i in range(40)]  # np.round(np.linspace(0, 100, num=40))
DOCUMENT = "Document {i}:\n{document}"  # qa.py's DOCUMENT_PROMPT


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
    # niah: the keys asked, in the order asked (each key's values are next in `references`)
    queries: tuple[str, ...] = ()


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
