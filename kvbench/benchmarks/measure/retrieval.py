"""What the retrieval benchmarks (ruler, niah) share when they measure: the session and essay a
case opens, samples made once per run, one sample answered and recorded, and the score metrics
with their intervals (declared in kvbench.benchmarks.specs.retrieval)."""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from kvbench.benchmarks.measure.answering import Answer, ChatFrame, answer_all, frame
from kvbench.benchmarks.measure.context import RunContext
from kvbench.benchmarks.measure.prefill_chunks import case_prefill_chunk
from kvbench.benchmarks.specs.retrieval import RETRIEVAL_METRICS, RetrievalParams
from kvbench.benchmarks.measure.ruler_scoring import postprocess, sample_score
from kvbench.data.ruler import TASKS, RulerSample, make_sample
from kvbench.data.text import load_text, tokens_sha256
from kvbench.judge.intervals import wilson_interval
from kvbench.methods import implementation
from kvbench.methods.core.contracts import Implementation
from kvbench.models import budgets
from kvbench.models.session import Session, kv_bytes_per_layer_token, shares_prefill
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
        return cls(ctx, session, ChatFrame.of(session.tokenizer, ctx.chat, session.spec), text)

    def sample(self, source: tuple, **kwargs) -> RulerSample:
        """make_sample(**kwargs), its prompt measured as it is fed; made once per run and
        tokenizer (`source` names the texts it was drawn from, for the memo)."""
        def count(sample: RulerSample) -> int:
            return len(frame(self.session.tokenizer, self.chat, sample.context, sample.question,
                             sample.answer_prefix).ids)

        fixed = tuple(sorted((k, repr(v)) for k, v in kwargs.items()
                             if k not in ("essay", "qa_records")))
        key = ("ruler_sample", self.session.spec, self.ctx.chat.key(), source, fixed)
        return self.ctx.memo.get(key, lambda: make_sample(count_tokens=count, **kwargs))

    def prefill_chunk(self, method: Implementation, asked: int, context: int) -> int:
        """Tokens per prefill forward of prompts up to `context` tokens
        (kvbench.benchmarks.measure.prefill_chunks)."""
        return case_prefill_chunk(self.ctx, self.session, method, asked, context)

    def shared_prefill(self, method: Implementation, prompts: list[list[int]], params: Any,
                       chunk: int) -> PrefillStore | None:
        """The run's recorded prompts (kvbench.models.shared_prefill) where the method takes
        them, told which of this case's prompts to keep: those a later case of the run (same
        benchmark parameters, a method that shares the prefill) will read again."""
        def shares(other: Implementation) -> bool:
            return any(shares_prefill(self.session, other, len(ids), chunk) for ids in prompts)

        if not shares(method):
            return None
        store = self.ctx.memo.get(("prefill_store",), PrefillStore)
        later = any(case.params == params and case.backend == self.ctx.backend
                    and case.chat == self.ctx.chat
                    and shares(implementation(case.settings, case.backend))
                    for case in self.ctx.memo.later)
        store.expect(self.session, prompts if later else [], chunk)
        return store

    def answer(self, method: Implementation, samples: list[RulerSample], params: RetrievalParams,
               context: int, extras: list[dict[str, Any]] | None = None,
               enough: Callable[[list[float]], bool] = lambda scores: False,
               ) -> tuple[list[dict], list[Answer]]:
        """Answer the samples (prompts up to `context` tokens: the benchmark's nominal length,
        which sizes the prefill chunk), decoded together in groups (decode_groups); each record
        (with its `extras`) is kept in predictions.jsonl as its group finishes. After each
        group, enough(the scores so far) may end the case before the rest."""
        prompts = [frame(self.session.tokenizer, self.chat, sample.context, sample.question,
                         sample.answer_prefix) for sample in samples]
        extras = extras or [{} for _ in samples]
        chunk = self.prefill_chunk(method, params.prefill_chunk, context)
        shared = self.shared_prefill(method, [p.compressed(params.compress) for p in prompts],
                                     params, chunk)
        records, replies = [], []
        for group in self.decode_groups([len(prompt.ids) for prompt in prompts]):
            where = f"samples {group[0] + 1}-{group[-1] + 1}/{len(samples)}: "
            answers = answer_all(self.session, method, [prompts[i] for i in group],
                                 params.compress, [samples[i].tokens_to_generate for i in group],
                                 params.reads, lambda text: self.ctx.status(where + text),
                                 shared, chunk)
            for i, reply in zip(group, answers, strict=True):
                sample, metric = samples[i], TASKS[samples[i].task].metric
                record = {
                    **extras[i], "task": sample.task, "index": sample.index,
                    "prompt_sha256": tokens_sha256(prompts[i].ids),
                    "prompt_tokens": len(prompts[i].ids), "depths": list(sample.depths),
                    "prediction": reply.text, "scored_text": reply.scored,
                    "references": list(sample.references), "metric": METRIC_NAMES[metric],
                    "score": sample_score(postprocess(reply.scored), sample.references, metric),
                    "generated": reply.generated,
                }
                self.ctx.keep(record)
                records.append(record)
                replies.append(reply)
            if enough([r["score"] for r in records]):
                break
        return records, replies

    def decode_groups(self, prompt_tokens: list[int]) -> list[list[int]]:
        """Consecutive samples decoded together (one-token steps are bound by reading the
        weights, which a batched step reads once for all its rows): at most budgets.MAX_ROWS,
        their prompts' plain K+V (at the model's dtype, every row as long as the group's
        longest) within a share of the device's free memory, sized once per run
        (kvbench.models.budgets.decode_budget)."""
        s = self.session
        per_token = s.num_layers * kv_bytes_per_layer_token(s, s.kv_element_size)
        budget = self.ctx.memo.get(("decode_budget", *s.memo_key),
                                   lambda: budgets.decode_budget(s.free_memory()))
        groups: list[list[int]] = [[]]
        for index, tokens in enumerate(prompt_tokens):
            group = groups[-1]
            longest = max([prompt_tokens[i] for i in group] + [tokens])
            if group and (len(group) == budgets.MAX_ROWS
                          or (len(group) + 1) * longest * per_token > budget):
                group = []
                groups.append(group)
            group.append(index)
        return groups if groups[0] else []


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
        "empty_predictions": m["empty_predictions"].of(sum(not r.scored.strip()
                                                           for r in replies)),
        "generated_tokens": m["generated_tokens"].of(statistics.fmean(r.generated
                                                                      for r in replies)),
        "compression_ratio": m["compression_ratio"].of(sum(r.bytes_16bit for r in replies) / kv),
        "retained_kv": m["retained_kv"].of(kv / sum(r.bytes_plain for r in replies)),
    }


def common_info(replies: list[Answer], method: Implementation, reads: str,
                chunk: int) -> dict[str, Any]:
    if replies[0].decoded_reads:
        path = "decoded once"
    elif reads == "packed":
        path = "packed"
    else:  # asked for, not taken: nothing packed (token methods), or a codec like turbo's
        path = "as stored (no decoded-once path)"
    return {
        # per sample, in the order of `scores`: what output-length drift is paired on
        "generated": [r.generated for r in replies],
        "answer_s": [r.seconds for r in replies],
        "codec_reads": path,
        "layout": method.layout(),
        "prefill_chunk": chunk,
    }


def haystack_note(task: str, essay: str) -> str:
    spec = TASKS[task]
    if spec.needs_essay:
        return f"text {essay!r} in place of RULER's Paul Graham essays"
    return f"{spec.haystack} (as RULER)"


def prompts_digest(records: list[dict[str, Any]]) -> str:
    return hashlib.sha256(",".join(r["prompt_sha256"] for r in records).encode()).hexdigest()
