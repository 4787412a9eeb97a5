"""A method's one-time set-up, done through a throwaway cache before a measurement starts: the
fused reads' kernels compile at their first use (numba's own start ~100 MB resident on the CPU,
then ~45 MB per format), which a case would otherwise count as its own evaluation and time."""
from __future__ import annotations

from kvbench.methods.core.contracts import Implementation
from kvbench.models.session import Session, prefill

# Past every shipped method's raw window (kivi's residual, quanto's), so its packed reads run.
WARM_UP_TOKENS = 512


def warm_up(session: Session, method: Implementation, tokens: list[int] | None = None) -> bool:
    """Prefill `tokens` (default WARM_UP_TOKENS of filler text) through a fresh cache of
    `method`, then one decode step alone and one batched (a retrieval benchmark's answers), the
    paths a case's decoding takes."""
    if tokens is None:
        tokens = filler_tokens(session, WARM_UP_TOKENS)
    cache = session.new_cache(method)
    logits = prefill(session, cache, tokens, method)[0]
    token = int(logits[-1].argmax())
    session.step([token], cache, last_only=True)
    session.step_rows([token], [cache])
    return True


def filler_tokens(session: Session, count: int) -> list[int]:
    ids = session.tokenizer.encode(" the quick brown fox" * count)
    return ids[:count]
