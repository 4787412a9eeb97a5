"""What the retrieval benchmarks (ruler, niah) share when they measure: the session and essay a
case opens, samples made once per run, one sample answered and recorded, and the score metrics
with their intervals (declared in kvbench.benchmarks.specs.retrieval)."""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from typing import Any

from kvbench.benchmarks.measure.answering import Answer, ChatFrame, answer, frame
from kvbench.benchmarks.measure.context import RunContext
from kvbench.benchmarks.specs.retrieval import RETRIEVAL_METRICS, RetrievalParams
from kvbench.benchmarks.measure.ruler_scoring import postprocess, sample_score
from kvbench.data.ruler import TASKS, RulerSample, make_sample
from kvbench.data.text import load_text, tokens_sha256
from kvbench.judge.intervals import wilson_interval
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session
from kvbench.models.shared_prefill import PrefillStore

METRIC_NAMES = {"all": "string_match_all", "part": "string_match_part"}
CALIBRATION_TOKENS = 512  # from the end of the essay text: far from any haystack at 8k

@dataclass
class Reader:
    """A case's model, chat frame and essay text, and the run's memo of generated samples."""

    ctx: RunContext
    session: Session
    chat: ChatFrame
    essay: str

    @classmethod
    def open(cls, ctx: RunContext, method: Implementation, essay: str) -> Reader:
        """The method is calibrated here, on the essay text's last tokens."""
        session = ctx.open_session()
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

    def shared_prefill(self) -> PrefillStore | None:
        """The run's recorded prompts, on torch (MLX sessions prefill per method)."""
        if self.ctx.backend != "torch":
            return None
        return self.ctx.memo.get(("prefill_store",), PrefillStore)

    def answer(self, method: Implementation, sample: RulerSample, params: RetrievalParams,
               **extra: Any) -> tuple[dict[str, Any], Answer]:
        """Answer one sample; its record (with `extra`) is kept in predictions.jsonl."""
        prompt = frame(self.session.tokenizer, self.chat, sample.context, sample.question,
                       sample.answer_prefix)
        reply = answer(self.session, method, prompt, params.compress, sample.tokens_to_generate,
                       params.reads, self.ctx.status, self.shared_prefill())
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


def common_info(replies: list[Answer], method: Implementation, reads: str) -> dict[str, Any]:
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
