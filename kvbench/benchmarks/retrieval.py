"""What the retrieval benchmarks (ruler, niah) share: their common parameters, the session and
essay a case opens, samples made once per run, one sample answered and recorded, and the score
metrics with their intervals."""
from __future__ import annotations

import dataclasses
import hashlib
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.benchmarks.answering import COMPRESS, READS, Answer, ChatFrame, answer, frame
from kvbench.benchmarks.base import Benchmark, MetricSpec, RunContext
from kvbench.benchmarks.ruler_scoring import postprocess, sample_score
from kvbench.data.ruler import TASKS, RulerSample, make_sample
from kvbench.data.text import load_text, parse_hf_source, resolve_text, tokens_sha256
from kvbench.judge.intervals import wilson_interval
from kvbench.methods.base import Method
from kvbench.models.info import ModelInfo
from kvbench.models.session import Session, open_session

METRIC_NAMES = {"all": "string_match_all", "part": "string_match_part"}
CALIBRATION_TOKENS = 512  # from the end of the essay text: far from any haystack at 8k

RETRIEVAL_METRICS = {
    "score": MetricSpec("%", "higher", "mean of NVIDIA RULER's per-sample score (0-100)"),
    "score_ci_low": MetricSpec("%", "none", "95% Wilson interval of score, low end"),
    "score_ci_high": MetricSpec("%", "none", "95% Wilson interval of score, high end"),
    "empty_predictions": MetricSpec("", "lower", "answers that were empty after decoding"),
    "compression_ratio": MetricSpec("x", "higher", "16-bit K+V of every token seen (prompt and"
                                    " answer) / accounted bytes held at the end, over samples"),
    "retained_kv": MetricSpec("x", "lower", "accounted bytes / the plain cache's K+V of every"
                              " token seen, at the model's dtype"),
}


def one_of(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


@dataclass(kw_only=True)
class RetrievalParams:
    """What ruler and niah share.

    data_seed: int = 0 — samples are drawn from (data_seed, task, sample index): every method
        of a run answers the same prompts.
    compress: str = "context" — "context": the context is prefilled and compressed, then the
        question is fed and answered from the compressed cache (kvpress's question-agnostic
        setting; a method's probe is its own, from the context); "context+question": the
        question is part of what is compressed.
    essay: str = "pydoc" — the text in place of RULER's Paul Graham essays (not shipped):
        "pydoc", a text file, or "hf:<dataset>[:<config>]:<split>:<column>".
    reads: str = "decoded" — "decoded": codec caches decode each packed chunk once
        (bit-identical outputs, the packed bytes accounted); "packed": decode at every step.
    """

    data_seed: int = 0
    compress: str = "context"
    essay: str = "pydoc"
    reads: str = "decoded"

    def __post_init__(self):
        one_of("compress", self.compress, COMPRESS)
        one_of("reads", self.reads, READS)
        if self.essay.startswith("hf:"):
            parse_hf_source(self.essay)


class RetrievalBenchmark(Benchmark):
    uses_model = True
    backends = ("torch", "mlx")
    metrics = RETRIEVAL_METRICS

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        return dataclasses.replace(params, essay=resolve_text(params.essay, base_dir))

    def check_model(self, params: Any, model: ModelInfo | None, longest: int) -> None:
        self.check_text_and_model(params.essay, model)
        self.check_length(model, "length", longest)


@dataclass
class Reader:
    """A case's model, chat frame and essay text, and the run's memo of generated samples."""

    ctx: RunContext
    session: Session
    chat: ChatFrame
    essay: str

    @classmethod
    def open(cls, ctx: RunContext, method: Method, essay: str) -> Reader:
        """The method is calibrated here, on the essay text's last tokens."""
        session = open_session(ctx)
        text = ctx.memo.get(("essay", essay), lambda: load_text(essay))
        tokens = session.tokenizer.encode(text[-CALIBRATION_TOKENS * 8:])[-CALIBRATION_TOKENS:]
        ctx.status("calibrate")
        session.calibrate(method, tokens)
        return cls(ctx, session, ChatFrame.of(session.tokenizer), text)

    def sample(self, source: tuple, **kwargs) -> RulerSample:
        """make_sample(**kwargs), its prompt measured as it is fed; made once per run and
        tokenizer (`source` names the texts it was drawn from, for the memo)."""
        def count(sample: RulerSample) -> int:
            return len(frame(self.session.tokenizer, self.chat, sample.context, sample.question,
                             sample.answer_prefix).ids)

        fixed = tuple(sorted((k, repr(v)) for k, v in kwargs.items()
                             if k not in ("essay", "qa_records")))
        return self.ctx.memo.get(("ruler_sample", self.session.spec, source, fixed),
                                 lambda: make_sample(count_tokens=count, **kwargs))

    def answer(self, method: Method, sample: RulerSample, params: RetrievalParams,
               **extra: Any) -> tuple[dict[str, Any], Answer]:
        """Answer one sample; its record (with `extra`) is kept in predictions.jsonl."""
        prompt = frame(self.session.tokenizer, self.chat, sample.context, sample.question,
                       sample.answer_prefix)
        reply = answer(self.session, method, prompt, params.compress, sample.tokens_to_generate,
                       params.reads, self.ctx.status)
        metric = TASKS[sample.task].metric
        record = {
            **extra, "task": sample.task, "index": sample.index,
            "prompt_sha256": tokens_sha256(prompt.ids), "prompt_tokens": len(prompt.ids),
            "depths": list(sample.depths), "prediction": reply.text,
            "references": list(sample.references), "metric": METRIC_NAMES[metric],
            "score": sample_score(postprocess(reply.text), sample.references, metric),
        }
        self.ctx.keep(record)
        return record, reply


def score_metrics(scores: list[float], replies: list[Answer]) -> dict[str, Any]:
    """score with its 95% interval, empty answers and the cache's sizes, over the samples."""
    m = RETRIEVAL_METRICS
    mean = statistics.fmean(scores)
    low, high = wilson_interval(mean, len(scores))
    kv = sum(r.kv_bytes for r in replies)
    return {
        "score": m["score"].of(mean),
        "score_ci_low": m["score_ci_low"].of(low),
        "score_ci_high": m["score_ci_high"].of(high),
        "empty_predictions": m["empty_predictions"].of(sum(not r.text.strip() for r in replies)),
        "compression_ratio": m["compression_ratio"].of(sum(r.bytes_16bit for r in replies) / kv),
        "retained_kv": m["retained_kv"].of(kv / sum(r.bytes_plain for r in replies)),
    }


def common_info(replies: list[Answer], method: Method, reads: str) -> dict[str, Any]:
    if replies[0].decoded_reads:
        path = "decoded once"
    elif reads == "packed":
        path = "packed"
    else:  # asked for, not taken: nothing packed (token methods), or a codec like turbo's
        path = "as stored (no decoded-once path)"
    return {
        "generated_tokens": statistics.fmean(r.generated for r in replies),
        "codec_reads": path,
        "layout": method.layout(),
    }


def haystack_note(task: str, essay: str) -> str:
    spec = TASKS[task]
    if spec.needs_essay:
        return f"text {essay!r} in place of RULER's Paul Graham essays"
    return f"{spec.haystack} (as RULER)"


def prompts_digest(records: list[dict[str, Any]]) -> str:
    return hashlib.sha256(",".join(r["prompt_sha256"] for r in records).encode()).hexdigest()
