"""`dataset`: a user's own samples (a local JSONL, JSON, CSV or Parquet file, or a dataset on the
Hugging Face Hub) answered through the compressed cache as ruler answers, scored with
LongBench's metrics (THUDM/LongBench)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvbench.benchmarks.records.dataset import DatasetRecord
from kvbench.benchmarks.reports.dataset import REPORT
from kvbench.benchmarks.specs.base import MetricSpec, ModelBenchmark, register_benchmark
from kvbench.benchmarks.specs.prefill import prefill_chunk_param
from kvbench.benchmarks.specs.retrieval import READS, RETRIEVAL_METRICS
from kvbench.config.fields import Settings, SettingError, at_least, param
from kvbench.data.prompt_template import LONGBENCH_QA, PromptTemplate
from kvbench.data.records import Fields, RecordsError, is_hf, read_records
from kvbench.models.info import ModelInfo

# the parameter to blame for each part of the data that cannot be read as asked
BLAMED = {"context": "context_field", "question": "question_field", "answers": "answers_field",
          "classes": "classes_field", "samples": "samples"}

DATASET_METRICS = {
    "score": MetricSpec("%", "higher", "mean over the scored samples of the sample's score"
                        " (0-100): the best of `metric` over its reference answers, as"
                        " LongBench scores"),
    "score_ci_low": MetricSpec("%", "none", "95% Wilson interval of score, low end (partial"
                               " scores taken as a proportion: conservative)"),
    "score_ci_high": MetricSpec("%", "none", "95% Wilson interval of score, high end"),
    "scored": MetricSpec("", "none", "samples scored: the rows read, less those skipped"),
    "skipped": MetricSpec("", "none", "samples skipped, their prompt longer than max_length"
                          " (truncation: skip)"),
    "truncated": MetricSpec("", "none", "samples cut to max_length in the middle (truncation:"
                            " middle)"),
    **{name: RETRIEVAL_METRICS[name] for name in ("empty_predictions", "generated_tokens",
                                                   "compression_ratio", "retained_kv")},
}


@dataclass
class DatasetParams(Settings):
    """Parameters of the dataset benchmark."""

    data: str | None = param(None, meaning="a local .jsonl, .json, .csv or .parquet file (relative"
                             " to the suite's folder), or hf:<dataset>[@<revision>][:<config>]:"
                             "<split> from the Hugging Face Hub (downloaded on first use)")
    context_field: str = param("context", meaning="the field holding a sample's context:"
                               " the template's {context}")
    question_field: str = param("input", meaning="the field holding a sample's question: the"
                                " template's {input} (not read when the template has none)")
    answers_field: str = param("answers", meaning="the field holding a sample's reference"
                               " answers: a string or a list of them")
    classes_field: str = param("all_classes", meaning="the field holding a sample's list of"
                               " classes (LongBench's all_classes; a choice set's choices),"
                               " read by metric classification only")
    metric: Literal["qa_f1", "rouge_l", "exact", "contains", "classification"] = param(
        "qa_f1", meaning="qa_f1: LongBench's token F1 after its normalize_answer; rouge_l:"
        " ROUGE-L F (rouge-score); exact: equal after normalize_answer; contains: the"
        " normalized reference's words a run of whole words in the normalized answer;"
        " classification: LongBench's classification_score over the classes")
    template: str = param(LONGBENCH_QA, meaning="the prompt, with one {context} and at most one"
                          " {input} after it ({{ and }} for literal braces); what precedes"
                          " and includes the context is what is compressed. Default:"
                          " LongBench's multifieldqa_en prompt")
    chat_template: bool = param(True, meaning="frame the prompt as a user message with the"
                                " model's chat template (LongBench skips it for its few-shot"
                                " and code tasks)")
    max_length: int = param(2048, range=at_least(16), meaning="the most tokens of a prompt as"
                            " fed (chat template included); a longer one is cut or skipped as"
                            " `truncation` says")
    truncation: Literal["middle", "skip"] = param(
        "middle", meaning="middle: keep the prompt's first and last max_length/2 tokens, as"
        " LongBench cuts; skip: leave the sample out, counted in `skipped`")
    answer_tokens: int = param(32, range=at_least(1), meaning="the most tokens generated per"
                               " answer (LongBench's max_gen: 32 for hotpotqa, 512 for"
                               " gov_report)")
    first_line: bool = param(False, meaning="score the answer's first line only (LongBench"
                             " does for trec, triviaqa, samsum and lsht)")
    samples: int | None = param(None, range=at_least(1), meaning="the first this many rows of"
                                " the data; None: every row")
    compress: Literal["context", "context+question"] = param(
        "context", meaning="context: the template's text up to and including the context is"
        " prefilled and compressed, then the rest is fed and answered from the compressed"
        " cache; context+question: the whole prompt is compressed")
    reads: Literal["auto", "decoded", "packed"] = param("auto", meaning=READS)
    prefill_chunk: int = prefill_chunk_param()

    def check(self) -> None:
        if self.data is None:
            raise SettingError("data", "set data: a local .jsonl, .json, .csv or .parquet file,"
                               " or hf:<dataset>[:<config>]:<split>")
        try:
            PromptTemplate.parse(self.template)
        except ValueError as exc:
            raise SettingError("template", str(exc)) from None

    def fields(self) -> Fields:
        asks = PromptTemplate.parse(self.template).asks
        return Fields(self.context_field, self.question_field if asks else None,
                      self.answers_field,
                      self.classes_field if self.metric == "classification" else None)


@register_benchmark("dataset")
class Dataset(ModelBenchmark):
    """Your own samples through the cache, scored with LongBench's metrics.

    Rows of a local JSONL/JSON/CSV/Parquet file (or a dataset on the Hugging Face Hub,
    downloaded on first use) mapped to a context, a question and reference answers, filled into a LongBench-style
    template, framed by the model's chat template, cut in the middle or skipped past
    max_length; the context is prefilled and compressed once by the method and the answer is
    decoded greedily through the compressed cache (as ruler answers), scored with qa_f1,
    rouge_l, exact, contains or classification as LongBench scores (the best over the
    references)."""
    measured_in = "kvbench.benchmarks.measure.dataset"
    report = REPORT
    record = DatasetRecord

    Params = DatasetParams
    metrics = DATASET_METRICS
    extras = ("datasets",)  # the datasets library and rouge-score

    def resolve_paths(self, params: DatasetParams, base_dir: Path) -> DatasetParams:
        if params.data is None or is_hf(params.data):
            return params
        path = Path(params.data).expanduser()
        return dataclasses.replace(params, data=str(path if path.is_absolute()
                                                    else base_dir / path))

    def workload(self, params: DatasetParams) -> float:
        # every row when samples is unset: LongBench's tasks have 200 (the file is not read here)
        return float((params.samples or 200) * params.max_length)

    def check(self, params: DatasetParams, model: ModelInfo | None) -> None:
        """The data is read here, before any work: a missing file, field or value is refused
        naming the data and the field."""
        try:
            read_records(params.data, params.fields(), params.samples)
        except RecordsError as exc:
            raise SettingError((BLAMED[exc.role], "data") if exc.role else "data",
                               str(exc)) from None
        self.check_length(self.require_model(model), "max_length + answer_tokens",
                          params.max_length + params.answer_tokens, "max_length",
                          "answer_tokens")
