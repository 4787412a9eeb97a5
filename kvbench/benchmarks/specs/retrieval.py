"""What the retrieval benchmarks (ruler, niah) declare alike: their common parameters, the score
metrics with their intervals, and the checks of the essay and the model."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvbench.config.fields import Settings, SettingError, param
from kvbench.benchmarks.specs.base import MetricSpec, ModelBenchmark
from kvbench.benchmarks.specs.prefill import prefill_chunk_param
from kvbench.data.text import parse_hf_source, resolve_text
from kvbench.models.info import ModelInfo

RETRIEVAL_METRICS = {
    "score": MetricSpec("%", "higher", "mean of NVIDIA RULER's per-sample score (0-100)"),
    "score_ci_low": MetricSpec("%", "none", "95% Wilson interval of score, low end"),
    "score_ci_high": MetricSpec("%", "none", "95% Wilson interval of score, high end"),
    "empty_predictions": MetricSpec("", "lower", "answers that were empty after decoding"),
    "generated_tokens": MetricSpec("tok", "none", "tokens generated per answer, end-of-sequence"
                                   " not counted, the mean over samples (per sample:"
                                   " info.generated; a claim `generated_tokens - identity <= 2`"
                                   " is judged paired)"),
    "compression_ratio": MetricSpec("x", "higher", "16-bit K+V of every token seen (prompt and"
                                    " answer) / accounted bytes held at the end, over samples"),
    "retained_kv": MetricSpec("x", "lower", "accounted bytes / the plain cache's K+V of every"
                              " token seen, at the model's dtype"),
}

# how an answering benchmark's codec caches are read (kvbench.benchmarks.measure.answering)
READS = ("auto: decoded where one layer's decoded copy of the prompt and answer is small (up to"
         " 8 MiB), else packed; decoded: codec caches decode each packed chunk once and keep it"
         " (bit-identical outputs, the packed bytes accounted, the decoded copy held beside"
         " them); packed: read as stored at every step (a fused kernel, else decoded part by"
         " part)")


@dataclass(kw_only=True)
class RetrievalParams(Settings):
    """What ruler and niah share."""

    data_seed: int = param(0, meaning="samples are drawn from (data_seed, task, sample index):"
                           " every method of a run answers the same prompts")
    compress: Literal["context", "context+question"] = param(
        "context", meaning="context: the context is prefilled and compressed, then the question"
        " is fed and answered from the compressed cache (kvpress's question-agnostic setting; a"
        " method's probe is its own, from the context); context+question: the question is part"
        " of what is compressed")
    essay: str = param("pydoc", meaning="the text in place of RULER's Paul Graham essays (not"
                       ' shipped): "pydoc", a text file, or'
                       ' "hf:<dataset>[:<config>]:<split>:<column>"')
    reads: Literal["auto", "decoded", "packed"] = param("auto", meaning=READS)
    prefill_chunk: int = prefill_chunk_param()

    def check(self) -> None:
        if self.essay.startswith("hf:"):
            try:
                parse_hf_source(self.essay)
            except ValueError as exc:
                raise SettingError("essay", str(exc)) from None


class RetrievalBenchmark(ModelBenchmark):
    metrics = RETRIEVAL_METRICS

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        return dataclasses.replace(params, essay=resolve_text(params.essay, base_dir))

    def check_model(self, params: Any, model: ModelInfo | None, longest: int,
                    length_field: str) -> None:
        self.check_text_and_model(params.essay, model, "essay")
        self.check_length(model, "length", longest, length_field)
