"""`dataset`: a user's samples answered through the method's cache and scored as LongBench scores.

Each row (kvbench.data.records) is filled into the template (kvbench.data.prompt_template),
framed by the model's chat template with the case's chat options (or, with chat_template: false,
as it is, without them) and cut in two as ruler's prompts are (answering.frame): the template's
text up to and including the context, which the method prefills and compresses once, and the
rest. A prompt longer than max_length
tokens is cut in the middle, its first and last max_length // 2 tokens kept as LongBench's
pred.py keeps them (on the tokens as fed, chat template included, each on its side of the
context's end; not decoded and encoded again), or skipped. The answers are decoded greedily
through the compressed caches by ruler's machinery (answering.answer_all, in the groups
Reader.decode_groups makes), scored (longbench_scoring) and kept in predictions.jsonl. Methods
that calibrate do so on pydoc's last tokens, as ruler's do by default.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvbench.benchmarks.measure.answering import Answer, ChatFrame, Prompt, answer_all, frame
from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.measure.longbench_scoring import sample_score
from kvbench.benchmarks.measure.retrieval import (
    Reader, common_info, prompts_digest, score_metrics,
)
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.dataset import DATASET_METRICS, Dataset, DatasetParams
from kvbench.data.prompt_template import PromptTemplate
from kvbench.data.records import Record, read_records
from kvbench.data.text import tokens_sha256
from kvbench.methods.core.contracts import Implementation

CALIBRATION_TEXT = "pydoc"  # never a sample's text


@dataclass(frozen=True)
class Sample:
    record: Record
    prompt: Prompt
    truncated: bool


def middle_cut(prompt: Prompt, max_length: int) -> Prompt:
    """LongBench's middle truncation on the prompt's tokens: its first and last max_length // 2
    (the prompt itself when it fits), each kept on its side of the cut between the context and
    the question."""
    ids = prompt.ids
    if len(ids) <= max_length:
        return prompt
    half = max_length // 2
    kept = [i for i in range(len(ids)) if i < half or i >= len(ids) - half]
    end = len(prompt.context)
    return Prompt([ids[i] for i in kept if i < end], [ids[i] for i in kept if i >= end],
                  prompt.reasoning_opened)


def prompts_of(reader: Reader, params: DatasetParams,
               records: list[Record]) -> tuple[list[Sample], list[int]]:
    """(the samples to answer, the rows skipped as longer than max_length)."""
    tokenizer = reader.session.tokenizer
    chat = reader.chat if params.chat_template else ChatFrame("", "")
    template = PromptTemplate.parse(params.template)
    samples, skipped = [], []
    for record in records:
        whole = frame(tokenizer, chat, template.context_text(record.context),
                      template.question_text(record.question), "")
        if len(whole.ids) <= params.max_length:
            samples.append(Sample(record, whole, False))
        elif params.truncation == "skip":
            skipped.append(record.row)
        else:
            samples.append(Sample(record, middle_cut(whole, params.max_length), True))
    return samples, skipped


@measures(Dataset)
class DatasetRun(Dataset):
    def run(self, params: DatasetParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        reader = Reader.open(ctx, method, CALIBRATION_TEXT)
        session = reader.session
        fields = params.fields()
        records = ctx.memo.get(("dataset_records", params.data, fields, params.samples),
                               lambda: read_records(params.data, fields, params.samples))
        key = ("dataset_prompts", *session.memo_key, reader.ctx.chat.key(), params.data, fields,
               params.samples, params.template, params.chat_template, params.max_length,
               params.truncation)
        samples, skipped = ctx.memo.get(key, lambda: prompts_of(reader, params, records))
        if not samples:
            raise ValueError(f"every one of the {len(records)} samples of data {params.data!r}"
                             f" is longer than max_length {params.max_length} tokens (truncation:"
                             " skip): nothing to score")
        prompts = [sample.prompt for sample in samples]
        chunk = reader.prefill_chunk(method, params.prefill_chunk, params.max_length)
        shared = reader.shared_prefill(method, [p.compressed(params.compress) for p in prompts],
                                       params, chunk)
        kept, replies = [], []
        for group in reader.decode_groups([len(p.ids) for p in prompts]):
            where = f"samples {group[0] + 1}-{group[-1] + 1}/{len(samples)}: "
            answers = answer_all(session, method, [prompts[i] for i in group], params.compress,
                                 [params.answer_tokens] * len(group), params.reads,
                                 lambda text: ctx.status(where + text), shared, chunk)
            for i, reply in zip(group, answers, strict=True):
                kept.append(record_of(params, samples[i], reply))
                ctx.keep(kept[-1])
                replies.append(reply)
        return output(params, method, reader, samples, skipped, kept, replies)


def record_of(params: DatasetParams, sample: Sample, reply: Answer) -> dict:
    """One answer as predictions.jsonl keeps it."""
    record = sample.record
    return {
        "row": record.row, "prompt_sha256": tokens_sha256(sample.prompt.ids),
        "prompt_tokens": len(sample.prompt.ids), "truncated": sample.truncated,
        "prediction": reply.text, "scored_text": reply.scored,
        "references": list(record.answers), "metric": params.metric,
        "score": sample_score(reply.scored, record.answers, params.metric, record.classes,
                              params.first_line),
        "generated": reply.generated,
    }


def output(params: DatasetParams, method: Implementation, reader: Reader, samples: list[Sample],
           skipped: list[int], kept: list[dict], replies: list[Answer]) -> BenchmarkOutput:
    m = DATASET_METRICS
    scores = [r["score"] for r in kept]
    truncated = [s.record.row for s in samples if s.truncated]
    return BenchmarkOutput(
        metrics={
            **score_metrics(scores, replies),
            "scored": m["scored"].of(len(scores)),
            "skipped": m["skipped"].of(len(skipped)),
            "truncated": m["truncated"].of(len(truncated)),
        },
        info={
            # per scored sample, in the order of `rows`: what kvbench.judge.paired pairs
            "scores": scores,
            "rows": [r["row"] for r in kept],
            "prompt_sha256s": [r["prompt_sha256"] for r in kept],
            "predictions": [r["prediction"] for r in kept],  # the gate lists flips
            "metric": params.metric,
            "skipped_rows": skipped,
            "truncated_rows": truncated,
            "prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in kept),
            **common_info(replies, method, params.reads,
                          reader.prefill_chunk(method, params.prefill_chunk, params.max_length)),
        },
        comparable={"prompts_sha256": prompts_digest(kept), "model": reader.session.spec,
                    "model_dtype": reader.session.dtype},
    )
