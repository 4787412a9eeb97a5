"""`multiturn`: one context compressed once and asked a question per turn, in SCBench's two modes.

Each sample is a conversation (kvbench.data.multiturn): an essay haystack with one needle per
turn, fitted to `length` tokens of the suite's model as ruler fits its prompts, framed by the
model's chat template with the case's chat options. Its context is prefilled and compressed once
(the run's shared prefill where the method starts from the plain one), then:

- multi-turn: turn 1 feeds the first question (the template's close, the answer prefix) and
  decodes; each later turn feeds what the previous answer left unfed, the template's text from
  an assistant answer to the next user message (between_turns), the next question, the close
  and its answer prefix, through the same cache, and decodes: the method's own answers are in
  what the later turns read. compress: context+question puts the first question in what is
  compressed; the later ones come after it, as in every mode.
- multi-request: each question is fed to an independent copy (session.fork) of the compressed
  context and decoded from it, as a single-turn RULER prompt would be.

The method compresses once and is never handed a question before it is asked. The rows of a
group (as Reader.decode_groups makes them) decode together, one batched step per token
(answering.decode_rows), each stopping at an end-of-sequence id or answer_tokens. Each answer
is scored as RULER scores niah (string_match_all), its reasoning left out, and kept in
predictions.jsonl. A reasoning model's earlier answers stay in the cache as it wrote them,
reasoning included (Qwen3's template leaves earlier reasoning out of the history it renders; a
cache fed turn by turn keeps what it was fed).

Per-(sample, turn) lists in info are sample-major: entry sample * turns + turn. An entry's
prompt hash is of the context and that turn's question as a single request asks it (what
multi-request feeds): in multi-turn the history before a question holds the method's own
answers, so it is not hashed, and two methods pair on the same contexts and questions.
"""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from typing import Any

from kvbench.benchmarks.measure.answering import (
    ChatFrame, answer_text, decode_rows, frame, keeps_decoded, prefill_through,
)
from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.measure.retrieval import Reader
from kvbench.benchmarks.measure.ruler_scoring import postprocess, sample_score
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.multiturn import MULTITURN_METRICS, Multiturn, MultiturnParams
from kvbench.data.multiturn import Conversation, make_conversation
from kvbench.data.text import tokens_sha256
from kvbench.judge.intervals import wilson_interval
from kvbench.methods.core.contracts import Implementation
from kvbench.models.chat import chat_text, has_chat_template
from kvbench.models.options import ChatOptions
from kvbench.models.session import plain_kv_bytes

_SLOTS = tuple(f"\uE000kvbench-turn-{i}\uE000" for i in (1, 2, 3))  # no template contains them
PLAIN_BETWEEN = "\n\n"  # a model without a chat template: the turns one paragraph apart


def between_turns(tokenizer: Any, options: ChatOptions = ChatOptions(),
                  model: str = "the model") -> str:
    """The chat template's text from the end of an assistant answer to the start of the next
    user message (SmolLM2: "<|im_end|>\\n<|im_start|>user\\n"), from the template itself over
    [user, assistant, user] with the chat options, as ChatFrame.of reads it; PLAIN_BETWEEN
    without a template."""
    if not has_chat_template(tokenizer):
        return PLAIN_BETWEEN
    messages = [{"role": role, "content": slot}
                for role, slot in zip(("user", "assistant", "user"), _SLOTS)]
    text = chat_text(tokenizer, messages, options, model)
    return text.partition(_SLOTS[1])[2].partition(_SLOTS[2])[0]


@dataclass(frozen=True)
class Plan:
    """One conversation's tokens."""

    conversation: Conversation
    context: list[int]  # the template's opening and the context: what is compressed
    asked: list[list[int]]  # per turn: its question, the close, its answer prefix, as asked
    # right after the context (the first turn of multi-turn; every turn of multi-request)
    later: list[list[int]]  # per turn from the second: the turn change, the question as a user
    # message of its own, the close, the answer prefix (multi-turn)
    reasoning_opened: bool  # each answer starts inside a reasoning block (ChatFrame's)

    @classmethod
    def of(cls, tokenizer: Any, chat: ChatFrame, conversation: Conversation,
           between: str) -> Plan:
        prompts = [frame(tokenizer, chat, conversation.context, turn.question, turn.answer_prefix)
                   for turn in conversation.turns]
        later = [tokenizer.encode(between + turn.message + chat.after + turn.answer_prefix,
                                  add_special_tokens=False)
                 for turn in conversation.turns[1:]]
        return cls(conversation, prompts[0].context, [p.question for p in prompts], later,
                   chat.reasoning_opened)

    def prompt_sha256(self, turn: int) -> str:
        return tokens_sha256(self.context + self.asked[turn])

    def held_tokens(self, params: MultiturnParams) -> int:
        """The most tokens its caches hold at once: the whole conversation (multi-turn), the
        context and a fork of it with the longest request (multi-request)."""
        if params.mode == "multi-turn":
            return (len(self.context) + len(self.asked[0]) + sum(map(len, self.later))
                    + params.turns * params.answer_tokens)
        return len(self.context) + self.cache_tokens(params)

    def cache_tokens(self, params: MultiturnParams) -> int:
        """The most tokens one of its caches holds: the whole conversation (multi-turn), the
        context and the longest request (multi-request, in a fork)."""
        if params.mode == "multi-turn":
            return self.held_tokens(params)
        return len(self.context) + max(map(len, self.asked)) + params.answer_tokens


@dataclass
class Reply:
    """One answer of one turn of one sample."""

    text: str  # as generated, its reasoning included
    scored: str  # what is scored: the text without its reasoning
    generated: int
    seconds: float  # its question's forward and the decode steps it took part in
    kv_bytes: int  # accounted bytes the cache holds after the answer
    bytes_16bit: int
    bytes_plain: int
    decoded_reads: bool


@measures(Multiturn)
class MultiturnRun(Multiturn):
    def run(self, params: MultiturnParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        reader = Reader.open(ctx, method, params.essay)
        session, tokenizer = reader.session, reader.session.tokenizer
        between = between_turns(tokenizer, ctx.chat, session.spec)
        plans = []
        for index in range(params.samples):
            ctx.status(f"sample {index + 1}/{params.samples}: prompt")
            plans.append(Plan.of(tokenizer, reader.chat, conversation(reader, params, index),
                                 between))
        first = params.compress == "context+question" and params.mode == "multi-turn"
        prefixes = [p.context + p.asked[0] if first else p.context for p in plans]
        chunk = reader.prefill_chunk(method, params.prefill_chunk, params.length)
        store = reader.shared_prefill(method, prefixes, params, chunk)
        replies: list[list[Reply]] = [[] for _ in plans]
        for group in reader.decode_groups([p.held_tokens(params) for p in plans]):
            where = f"samples {group[0] + 1}-{group[-1] + 1}/{len(plans)}"
            caches, logits = [], []
            for number, i in enumerate(group, 1):
                ctx.status(f"{where}: prefill {number}/{len(group)}")
                total = plans[i].cache_tokens(params)
                cache = session.new_cache(method,
                                          decoded_reads=keeps_decoded(session, params.reads, total))
                session.reserve(cache, total)
                last = prefill_through(session, cache, prefixes[i], method, chunk, store,
                                       total - len(prefixes[i]))
                caches.append(cache)
                logits.append(last[-1])
            answer = _multi_turn if params.mode == "multi-turn" else _multi_request
            for turn, answers in enumerate(answer(session, params, [plans[i] for i in group],
                                                  caches, logits, first,
                                                  lambda text: ctx.status(f"{where}: {text}"))):
                for i, reply in zip(group, answers, strict=True):
                    replies[i].append(reply)
                    _keep(ctx, params, plans[i], turn, reply)
        return output(params, method, reader, plans, replies)


def conversation(reader: Reader, params: MultiturnParams, index: int) -> Conversation:
    """The index-th conversation, its first prompt measured as it is fed; made once per run and
    tokenizer."""
    session = reader.session

    def count(sample) -> int:
        return len(frame(session.tokenizer, reader.chat, sample.context, sample.question,
                         sample.answer_prefix).ids)

    key = ("multiturn_sample", session.spec, reader.ctx.chat.key(), params.essay, index,
           params.length, params.turns, params.data_seed)
    return reader.ctx.memo.get(key, lambda: make_conversation(
        index, turns=params.turns, length=params.length, count_tokens=count,
        seed=params.data_seed, essay=reader.essay))


def _multi_turn(session, params: MultiturnParams, plans: list[Plan], caches: list,
                logits: list, first_compressed: bool, status):
    """Per turn, the group's replies: one conversation per cache."""
    unfed: list[list[int]] = [[] for _ in plans]
    for turn in range(params.turns):
        status(f"turn {turn + 1}/{params.turns}: question")
        asked_s = [0.0] * len(plans)
        for row, plan in enumerate(plans):
            if turn == 0 and first_compressed:
                continue  # the first question was compressed with the context
            ids = plan.asked[0] if turn == 0 else unfed[row] + plan.later[turn - 1]
            last, asked_s[row] = session.step(ids, caches[row], last_only=True)
            logits[row] = last[-1]
        decoded = decode_rows(session, caches, logits, [params.answer_tokens] * len(plans),
                              lambda text: status(f"turn {turn + 1}/{params.turns}: {text}"))
        unfed = [row.unfed for row in decoded]
        yield [_reply(session, cache, row, seconds, plan)
               for cache, row, seconds, plan in zip(caches, decoded, asked_s, plans, strict=True)]


def _multi_request(session, params: MultiturnParams, plans: list[Plan], caches: list,
                   logits: list, first_compressed: bool, status):
    """Per turn, the group's replies: each from a fork of its compressed context."""
    for turn in range(params.turns):
        status(f"request {turn + 1}/{params.turns}: question")
        forks, last_logits, asked_s = [], [], []
        for row, plan in enumerate(plans):
            fork = session.fork(caches[row])
            last, seconds = session.step(plan.asked[turn], fork, last_only=True)
            forks.append(fork)
            last_logits.append(last[-1])
            asked_s.append(seconds)
        decoded = decode_rows(session, forks, last_logits, [params.answer_tokens] * len(plans),
                              lambda text: status(f"request {turn + 1}/{params.turns}: {text}"))
        yield [_reply(session, fork, row, seconds, plan)
               for fork, row, seconds, plan in zip(forks, decoded, asked_s, plans, strict=True)]


def _reply(session, cache, decoded, asked_s: float, plan: Plan) -> Reply:
    bytes_16bit, bytes_plain = plain_kv_bytes(session, cache)
    text, scored = answer_text(session, decoded.tokens, plan.reasoning_opened)
    return Reply(text=text, scored=scored,
                 generated=len(decoded.tokens), seconds=asked_s + decoded.seconds,
                 kv_bytes=cache.accounted_bytes(), bytes_16bit=bytes_16bit,
                 bytes_plain=bytes_plain, decoded_reads=bool(getattr(cache, "decoded_reads",
                                                                     False)))


def score_of(reply: Reply, references: tuple[str, ...]) -> float:
    return sample_score(postprocess(reply.scored), references, "all")


def _keep(ctx: RunContext, params: MultiturnParams, plan: Plan, turn: int, reply: Reply) -> None:
    asked = plan.conversation.turns[turn]
    ctx.keep({"index": plan.conversation.index, "turn": turn + 1, "mode": params.mode,
              "key": asked.key, "depth": asked.depth, "prompt_sha256": plan.prompt_sha256(turn),
              "prediction": reply.text, "scored_text": reply.scored,
              "references": list(asked.references),
              "metric": "string_match_all", "score": score_of(reply, asked.references),
              "generated": reply.generated, "retained_bytes": reply.kv_bytes})


def slope(means: list[float]) -> float:
    """Least-squares slope of means[t] against t (points per turn)."""
    turns = range(len(means))
    centre, mean = statistics.fmean(turns), statistics.fmean(means)
    spread = sum((t - centre) ** 2 for t in turns)
    return sum((t - centre) * (m - mean) for t, m in zip(turns, means)) / spread


def output(params: MultiturnParams, method: Implementation, reader: Reader, plans: list[Plan],
           replies: list[list[Reply]]) -> BenchmarkOutput:
    m = MULTITURN_METRICS
    turns, count = params.turns, len(plans)
    scores = [[score_of(reply, plan.conversation.turns[t].references)
               for t, reply in enumerate(rows)] for plan, rows in zip(plans, replies)]
    flat = [score for row in scores for score in row]
    every = [reply for rows in replies for reply in rows]
    per_turn = [statistics.fmean(row[t] for row in scores) for t in range(turns)]
    mean = statistics.fmean(flat)
    low, high = wilson_interval(mean, len(flat))
    kv = sum(r.kv_bytes for r in every)
    hashes = [plan.prompt_sha256(t) for plan in plans for t in range(turns)]
    if every[0].decoded_reads:
        reads = "decoded once"
    elif params.reads == "packed":
        reads = "packed"
    else:
        reads = "as stored (no decoded-once path)"
    return BenchmarkOutput(
        metrics={
            "score": m["score"].of(mean),
            "score_ci_low": m["score_ci_low"].of(low),
            "score_ci_high": m["score_ci_high"].of(high),
            "score_first": m["score_first"].of(per_turn[0]),
            "score_last": m["score_last"].of(per_turn[-1]),
            "turn_slope": m["turn_slope"].of(slope(per_turn)),
            "empty_predictions": m["empty_predictions"].of(
                sum(not r.scored.strip() for r in every)),
            "generated_tokens": m["generated_tokens"].of(
                statistics.fmean(r.generated for r in every)),
            "compression_ratio": m["compression_ratio"].of(
                sum(r.bytes_16bit for r in every) / kv),
            "retained_kv": m["retained_kv"].of(kv / sum(r.bytes_plain for r in every)),
        },
        info={
            "order": "sample-major: entry sample * turns + turn",
            "turns": turns,
            "scores": flat,
            "prompt_sha256s": hashes,
            "generated": [r.generated for r in every],
            "answer_s": [r.seconds for r in every],
            "turn_scores": per_turn,
            "turn_ci": [list(wilson_interval(s, count)) for s in per_turn],
            "turn_retained_bytes": [statistics.fmean(rows[t].kv_bytes for rows in replies)
                                    for t in range(turns)],
            "sample_scores": scores,
            "depths": [[turn.depth for turn in plan.conversation.turns] for plan in plans],
            "prompt_tokens": statistics.fmean(len(p.context) + len(p.asked[0]) for p in plans),
            "between_turns": between_turns(reader.session.tokenizer, reader.ctx.chat,
                                           reader.session.spec),
            "haystack": f"text {params.essay!r} in place of RULER's Paul Graham essays",
            "codec_reads": reads,
            "layout": method.layout(),
            "prefill_chunk": reader.prefill_chunk(method, params.prefill_chunk, params.length),
        },
        comparable={"prompts_sha256": hashlib.sha256(",".join(hashes).encode()).hexdigest(),
                    "model": reader.session.spec, "model_dtype": reader.session.dtype},
    )
