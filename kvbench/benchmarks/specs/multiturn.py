"""`multiturn`: one long context asked several questions through one compressed cache, in
SCBench's two modes (microsoft/MInference scbench/, arXiv 2412.10319): scores per turn, where a
method that keeps less than the full cache loses what single-turn RULER cannot show."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvbench.config.fields import SettingError, at_least, param
from kvbench.benchmarks.records.multiturn import MultiturnRecord
from kvbench.benchmarks.reports.multiturn import REPORT
from kvbench.benchmarks.specs.base import MetricSpec, register_benchmark
from kvbench.benchmarks.specs.retrieval import (
    RETRIEVAL_METRICS, RetrievalBenchmark, RetrievalParams,
)
from kvbench.models.info import ModelInfo

# A later turn's text besides its answer: the template's turn change, the question with its key
# (two words: 6-12 tokens), the close and the answer prefix; about 45 tokens on SmolLM2's
# tokenizer, with room for a longer template.
TURN_TOKENS = 64
TOKENS_TO_GENERATE = 128  # RULER's for niah: in `length`, as ruler counts it

MULTITURN_METRICS = {
    "score": MetricSpec("%", "higher", "mean of RULER's per-answer score (0-100) over every"
                        " (sample, turn)"),
    "score_ci_low": MetricSpec("%", "none", "95% Wilson interval of score over the samples x"
                               " turns answers, low end (the turns of a sample share its"
                               " context: narrower than over independent samples)"),
    "score_ci_high": MetricSpec("%", "none", "95% Wilson interval of score, high end"),
    "score_first": MetricSpec("%", "higher", "mean score of the first turn"),
    "score_last": MetricSpec("%", "higher", "mean score of the last turn"),
    "turn_slope": MetricSpec("points/turn", "none", "least-squares slope of the per-turn mean"
                             " scores against the turn number"),
    "empty_predictions": RETRIEVAL_METRICS["empty_predictions"],
    "generated_tokens": MetricSpec("tok", "none", "tokens generated per answer, end-of-sequence"
                                   " not counted, the mean over every (sample, turn) (each:"
                                   " info.generated; a claim `generated_tokens - identity <= 2`"
                                   " is judged paired)"),
    "compression_ratio": MetricSpec("x", "higher", "16-bit K+V of every token the cache has"
                                    " seen / accounted bytes it holds, each at the end of an"
                                    " answer, summed over every (sample, turn)"),
    "retained_kv": MetricSpec("x", "lower", "accounted bytes / the plain cache's K+V of every"
                              " token seen at the model's dtype, pooled as compression_ratio"),
}


@dataclass
class MultiturnParams(RetrievalParams):
    """Parameters of the multiturn benchmark, and RetrievalParams' data_seed, compress, essay,
    reads (compress: context+question is the multi-turn mode's only)."""

    mode: Literal["multi-turn", "multi-request"] = param(
        "multi-turn", meaning="multi-turn: one conversation, each turn's question and the"
        " model's answer appended to the same cache after the previous turn's; multi-request:"
        " each question answered on its own from a copy of the same compressed context")
    turns: int = param(4, range=at_least(2), meaning="questions per context, one needle each,"
                       " asked in a random order of the needles")
    length: int = param(1024, range=at_least(256), meaning="model tokens of the framed context"
                        " and the first question, plus RULER's 128 tokens to generate (as ruler"
                        " counts a prompt)")
    samples: int = param(24, range=at_least(1), meaning="contexts per case, each asked `turns`"
                         " questions")
    answer_tokens: int = param(32, range=at_least(1), meaning="the most tokens generated per"
                               " answer (a 7-digit number takes a few)")

    def check(self) -> None:
        super().check()
        if self.mode == "multi-request" and self.compress != "context":
            raise SettingError(("compress", "mode"), "compress: context+question compresses the"
                               " first question with the context, which every request of"
                               " multi-request would then read before its own: use compress:"
                               " context there (multi-turn takes either)")


@register_benchmark("multiturn")
class Multiturn(RetrievalBenchmark):
    """One context, several questions, one compressed cache (SCBench's two modes); scores per turn.

    An essay haystack (pydoc by default) with one needle per turn, fitted to `length` tokens as
    ruler fits its samples, is prefilled and compressed once; each turn asks for one needle's
    number in RULER's single-needle wording. multi-turn: the questions and the model's own
    answers follow each other in one conversation through the same cache; multi-request: each
    question is answered from an independent copy of the compressed context. The method never
    sees a question before it is asked (compress: context), or sees the first with the context
    (context+question, multi-turn)."""
    measured_in = "kvbench.benchmarks.measure.multiturn"
    report = REPORT
    record = MultiturnRecord

    Params = MultiturnParams
    metrics = MULTITURN_METRICS

    def check(self, params: MultiturnParams, model: ModelInfo | None) -> None:
        self.check_model(params, model, conversation_tokens(params), "length")

    def check_model(self, params: MultiturnParams, model: ModelInfo | None, longest: int,
                    length_field: str) -> None:
        self.check_text_and_model(params.essay, model, "essay")
        self.check_length(model, what(params), longest, length_field, "turns", "answer_tokens")


def conversation_tokens(params: MultiturnParams) -> int:
    """The most tokens one cache holds: the whole conversation in multi-turn (about: each later
    turn's text counted as TURN_TOKENS), one request in multi-request."""
    request = params.length - TOKENS_TO_GENERATE + params.answer_tokens
    if params.mode == "multi-request":
        return max(params.length, request)
    return max(params.length, request) + (params.turns - 1) * (TURN_TOKENS
                                                               + params.answer_tokens)


def what(params: MultiturnParams) -> str:
    if params.mode == "multi-request":
        return "length (one request)"
    return (f"length + {params.turns - 1} later turns x ({TURN_TOKENS} of question +"
            f" answer_tokens {params.answer_tokens})")
