"""How many prompt tokens a case feeds per forward: what its benchmark asks (`prefill_chunk`),
else the model's, device's and context's default, sized once per run and context so that every
case of the run at that context (and the prompts they share) is prefilled alike."""
from __future__ import annotations

from kvbench.benchmarks.measure.context import RunContext
from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, default_prefill_chunk


def case_prefill_chunk(ctx: RunContext, session: Session, method: Implementation | None,
                       asked: int, context: int) -> int:
    """Tokens per prefill forward of prompts up to `context` tokens (the benchmark's nominal
    length, the same for every method); 0: one forward whatever the prompt, for a method that
    must see the prompt at once (its capabilities' chunked_prefill)."""
    if method is not None and not method.supports().chunked_prefill:
        return 0
    return asked or ctx.memo.get(("prefill_chunk", *session.memo_key, context),
                                 lambda: default_prefill_chunk(session, context=context))
