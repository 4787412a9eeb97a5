"""`compaction`: seed 000's demo. A trajectory (a passage) is prefilled and compacted, then a task
question is asked from the compacted cache and the answer generated greedily: how far the
trajectory shrank, how long compaction took, the answer, and whether it holds the fact.

With `probe` (the default) the question is first fed through the cache and taken back before
end_prefill, so a task-guided method (am_task) or SnapKV can use its queries; without it a method
gets its own reference probe, if it has one (am with `queries: repeat`). The plain cache answers the same question from the whole trajectory.

With `chat`, the prompt is one user message in the model's chat template with the case's chat
options; an answer ends at any of the model's end-of-sequence ids, and whether it holds the fact
is read from it without its reasoning (kvbench.models.chat.split_reasoning).
"""
from __future__ import annotations


from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.compaction import Compaction, CompactionParams
from kvbench.data.text import tokens_sha256
from kvbench.methods.core.contracts import Implementation
from kvbench.models.chat import chat_text, opens_reasoning, split_reasoning
from kvbench.models.options import ChatOptions
from kvbench.models.session import ProbeNotTakenBack, Session, prefill


@measures(Compaction)
class CompactionRun(Compaction):
    def run(self, params: CompactionParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session = ctx.open_session()
        trajectory, task, opened = _prompt(session, params, ctx.chat)
        sha = tokens_sha256(trajectory + task)

        def plain_answer() -> list[int]:
            ctx.status("plain answer")
            plain_cache = session.new_cache(None)
            session.step(trajectory, plain_cache, last_only=True)
            return _answer(session, plain_cache, task, params.max_new_tokens)

        # Every method of the run compares with the same plain answer to the same prompt.
        plain = ctx.memo.get(("compaction.plain_answer", *session.memo_key,
                              tokens_sha256(trajectory), tokens_sha256(task),
                              params.max_new_tokens), plain_answer)

        ctx.status("compact")
        timings = []  # (prefill forward seconds, compaction seconds) per repeat
        for _ in range(ctx.repeats):
            cache = session.new_cache(method)
            try:
                _, forward_s, compact_s = prefill(session, cache, trajectory, method,
                                                  probe=task if params.probe else None)
            except ProbeNotTakenBack as exc:
                raise ValueError(f"{exc}; set probe: false for it") from None
            timings.append((forward_s, compact_s))
        kept = [p.retained_tokens + p.summary_slots for p in cache.policies]
        mean_kept = sum(kept) / len(kept)
        ctx.status("answer")
        answer = _answer(session, cache, task, params.max_new_tokens)

        text, plain_text = session.tokenizer.decode(answer), session.tokenizer.decode(plain)
        same = sum(a == b for a, b in zip(answer, plain)) / max(len(answer), len(plain))
        m = self.metrics
        metrics = {
            "prompt_tokens": m["prompt_tokens"].of(len(trajectory)),
            "kept_tokens": m["kept_tokens"].of(mean_kept),
            "retention": m["retention"].of(mean_kept / len(trajectory)),
            "compaction_s": m["compaction_s"].of_samples([c for _, c in timings]),
            "compaction_vs_prefill": m["compaction_vs_prefill"].of_samples(
                [c / f for f, c in timings]),
            "answer_agreement": m["answer_agreement"].of(same),
        }
        if params.expect:
            holds = [params.expect in split_reasoning(t, opened).answer for t in (text, plain_text)]
            metrics["answer_holds_fact"] = m["answer_holds_fact"].of(holds[0])
            metrics["plain_holds_fact"] = m["plain_holds_fact"].of(holds[1])
        return BenchmarkOutput(
            metrics=metrics,
            info={"layout": method.layout(), "answer": text, "plain_answer": plain_text,
                  "kept_tokens_per_layer": kept},
            comparable={"tokens_sha256": sha, "model": session.spec,
                        "model_dtype": session.dtype},
        )


def _prompt(session: Session, params: CompactionParams,
            chat: ChatOptions) -> tuple[list[int], list[int], bool]:
    """(trajectory tokens, task tokens, whether the answer starts inside a reasoning block);
    with chat, the template's text around them (with the chat options) goes to the trajectory
    before it and to the task after it."""
    tokenizer = session.tokenizer
    if not params.chat:
        return tokenizer.encode(params.trajectory), tokenizer.encode(" " + params.task), False
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"model {session.spec} has no chat template; set chat: false")
    message = {"role": "user", "content": f"{params.trajectory}\n{params.task}"}
    text = chat_text(tokenizer, [message], chat, session.spec)
    split = text.index(params.trajectory) + len(params.trajectory)
    encode = lambda part: tokenizer.encode(part, add_special_tokens=False)  # noqa: E731
    return encode(text[:split]), encode(text[split:]), opens_reasoning(text[split:])


def _answer(session: Session, cache, task: list[int], n: int) -> list[int]:
    """Greedy tokens after feeding `task` through `cache`, up to n or an end-of-sequence id. The
    task goes in one token at a time: after compaction, layers may keep different counts, which
    one causal mask for a multi-token step cannot fit."""
    for token in task:
        logits, _ = session.step([token], cache)
    stops = session.stop_ids
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n and tokens[-1] not in stops:
        logits, _ = session.step(tokens[-1:], cache)
        tokens.append(int(logits[-1].argmax()))
    return tokens[:-1] if tokens[-1] in stops else tokens
