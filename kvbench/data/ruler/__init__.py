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
from kvbench.data.ruler.generate import make_multikey_sample, make_sample
from kvbench.data.ruler.niah import key_question
from kvbench.data.ruler.qa_files import read_qa
from kvbench.data.ruler.tasks import OFFLINE_TASKS, TASKS, QARecord, RulerSample, TaskSpec

__all__ = ["OFFLINE_TASKS", "TASKS", "QARecord", "RulerSample", "TaskSpec", "key_question",
           "make_multikey_sample", "make_sample", "read_qa"]
