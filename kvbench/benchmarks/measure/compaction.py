"""`compaction`: seed 000's demo. A trajectory (a passage) is prefilled and compacted, then a task
question is asked from the compacted cache and the answer generated greedily: how far the
trajectory shrank, how long compaction took, the answer, and whether it holds the fact.

With `probe` (the default) the question is first fed through the cache and taken back before
end_prefill, so a task-guided method (am_task) or SnapKV can use its queries; without it a method
gets its own reference probe, if it has one (am with `queries: repeat`). The plain cache answers the same question from the whole trajectory.
"""
from __future__ import annotations


from kvbench.benchmarks.measure.context import BenchmarkOutput, RunContext
from kvbench.benchmarks.specs.base import measures
from kvbench.benchmarks.specs.compaction import Compaction, CompactionParams
from kvbench.data.text import tokens_sha256
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import ProbeNotTakenBack, Session, prefill


@measures(Compaction)
class CompactionRun(Compaction):
    def run(self, params: CompactionParams, method: Implementation,
            ctx: RunContext) -> BenchmarkOutput:
        session = ctx.open_session()
        trajectory, task = _prompt(session, params)
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
            metrics["answer_holds_fact"] = m["answer_holds_fact"].of(params.expect in text)
            metrics["plain_holds_fact"] = m["plain_holds_fact"].of(params.expect in plain_text)
        return BenchmarkOutput(
            metrics=metrics,
            info={"layout": method.layout(), "answer": text, "plain_answer": plain_text,
                  "kept_tokens_per_layer": kept},
            comparable={"tokens_sha256": sha, "model": session.spec,
                        "model_dtype": session.dtype},
        )


def _prompt(session: Session, params: CompactionParams) -> tuple[list[int], list[int]]:
    """(trajectory tokens, task tokens); with chat, the template's text around them goes to the
    trajectory before it and to the task after it."""
    tokenizer = session.tokenizer
    if not params.chat:
        return tokenizer.encode(params.trajectory), tokenizer.encode(" " + params.task)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"model {session.spec} has no chat template; set chat: false")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{params.trajectory}\n{params.task}"}],
        tokenize=False, add_generation_prompt=True)
    split = text.index(params.trajectory) + len(params.trajectory)
    encode = lambda part: tokenizer.encode(part, add_special_tokens=False)  # noqa: E731
    return encode(text[:split]), encode(text[split:])


def _answer(session: Session, cache, task: list[int], n: int) -> list[int]:
    """Greedy tokens after feeding `task` through `cache`, up to n or the end of sequence. The
    task goes in one token at a time: after compaction, layers may keep different counts, which
    one causal mask for a multi-token step cannot fit."""
    for token in task:
        logits, _ = session.step([token], cache)
    eos = getattr(session.tokenizer, "eos_token_id", None)
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n and tokens[-1] != eos:
        logits, _ = session.step(tokens[-1:], cache)
        tokens.append(int(logits[-1].argmax()))
    return tokens[:-1] if tokens[-1] == eos else tokens
