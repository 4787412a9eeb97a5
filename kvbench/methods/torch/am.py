"""Attention Matching compaction (`am`, Zweiger et al. 2026) and its task-guided variant
(`am_task`, Latent Briefing): at end_prefill each layer's prompt is replaced by t keys per KV head,
a fitted bias beta on their logits, and fitted values, so that softmax(Q C_k^T + beta) C_v matches
softmax(Q K^T) V on reference queries (the math: kvbench.methods.torch.am_fit). Beta is added to those
t slots' logits for every later query inside the model's attention; new tokens follow them with
positions continuing from the prompt length.
"""
from __future__ import annotations

import torch

from kvbench.backends.torch_arrays import TORCH_ARRAYS
from kvbench.methods.core.tail import Tail
from kvbench.methods.settings.am import AM, AMTask
from kvbench.methods.settings.base import implements
from kvbench.methods.torch import am_fit
from kvbench.methods.torch.token_cache import ScorerCache, per_kv_head


@implements(AM)
class AMCache(ScorerCache):
    method: AM

    def __init__(self, method: AM):
        super().__init__(method)
        self.prompt_tokens = 0  # as begin_prompt announced it (0: not)
        # when fewer than every token's: the queries taken, in one buffer sized for the prompt
        # (pieces, a forward's each, were held twice once joined for the fit), and their
        # positions
        self.strided = Tail(TORCH_ARRAYS)
        self.taken: list[torch.Tensor] = []

    @classmethod
    def queries_read(cls, method: AM) -> int | None:
        return 0 if method.queries == "repeat" else None

    def begin_prompt(self, tokens: int) -> None:
        super().begin_prompt(tokens)
        self.prompt_tokens = tokens

    def stride(self, query_heads: int, tokens: int) -> int:
        """Every how many tokens of a prompt of `tokens` the reference queries are taken, so
        that a KV head has at most max_queries of them (1: every token)."""
        groups, most = query_heads // self.keys.shape[1], self.method.max_queries
        return max(1, -(-groups * tokens // most)) if most else 1

    def observe(self, queries: torch.Tensor) -> None:
        """Every query of a prompt announced short enough; else those of the tokens at
        multiples of the stride, as they come (the rest is never held)."""
        stride = self.stride(queries.shape[1], self.prompt_tokens)
        if stride == 1 or type(self).queries_read(self.method) is not None:
            return super().observe(queries)
        first = self._seen - queries.shape[-2]
        at = torch.arange(first + (-first) % stride, self._seen, stride, device=queries.device)
        self.strided.extend(queries[..., at - first, :].float(),
                            -(-self.prompt_tokens // stride))
        self.observed = [self.strided.array]
        self.taken.append(at)

    def trim(self, n: int) -> int:
        if not self.taken:
            return super().trim(n)
        self.observed = []  # not per token: no probe is made of them
        dropped = super().trim(n)
        at = torch.cat(self.taken)
        kept = int((at < self._seen).sum())  # the positions ascend: the first `kept`
        self.strided.trim(self.strided.tokens - kept)
        self.observed, self.taken = [self.strided.array], [at[:kept]]
        return dropped

    def end_prefill(self) -> None:
        super().end_prefill()
        self.strided, self.taken = Tail(TORCH_ARRAYS), []

    def reference_queries(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(1, Hq, n, D) queries, and with `causal` their prompt positions (n,): the model's own
        queries over the prompt, or (`queries: repeat`) those of the prompt fed again after
        itself, which come after every key."""
        if self.method.queries == "repeat":
            if self.probe is None:
                raise RuntimeError("am with queries: repeat needs its reference probe (the prompt"
                                   " again) fed and taken back before end_prefill; kvbench's"
                                   " benchmarks do (kvbench.models.session.prefill)")
            return self.probe, None
        queries = self.observed_queries()
        if self.taken:
            self.taken = [torch.cat(self.taken)]
            at = self.taken[0]
        else:  # every token's (a prompt not announced): the stride's tokens of them
            at = torch.arange(0, queries.shape[-2], self.stride(queries.shape[1], self._seen),
                              device=queries.device)
            queries = queries[..., at, :] if len(at) < queries.shape[-2] else queries
        return queries, (at if self.method.causal else None)

    def positions(self, first: int, n: int) -> torch.Tensor | None:
        if not self.method.causal:
            return None
        return torch.arange(first, first + n, device=self.keys.device)

    def fit_queries(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The reference queries per KV head (H, groups * n, D), and their positions when
        causal, as scores and fits take them."""
        queries, positions = self.reference_queries()
        queries = per_kv_head(queries, self.keys.shape[1])
        if positions is not None:  # rows of per_kv_head: each query head's n queries in turn
            positions = positions.repeat(queries.shape[1] // positions.shape[0])
        return queries, positions

    def scores(self) -> torch.Tensor:
        queries, positions = self.fit_queries()
        return am_fit.key_scores(queries, self.keys[0].float(), self.scaling, self.method.score,
                                 positions)

    def compact(self, index: torch.Tensor) -> None:
        m = self.method
        queries, positions = self.fit_queries()
        beta, fitted = am_fit.fit_in_segments(
            queries, self.keys[0].float(), self.values[0].float(), index[0], self.scaling,
            m.segment, m.fit_beta, m.fit_values, m.ridge, m.seed, positions)
        # the bias is stored at the keys' dtype: t per head, counted like a key element
        self.keep(index, values=None if fitted is None else fitted.to(self.values.dtype)[None],
                  bias=beta.to(self.keys.dtype)[None] if m.fit_beta else None)


@implements(AMTask)
class AMTaskCache(AMCache):
    method: AMTask

    @classmethod
    def queries_read(cls, method: AMTask) -> int | None:
        return method.task_tokens

    def reference_queries(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A task prompt's queries: a probe taken back before end_prefill (it came after every
        key: never causal), else the prompt's last `task_tokens` queries."""
        if self.probe is not None:
            return self.probe, None
        queries = self.observed_queries(last=self.method.task_tokens)
        n = queries.shape[-2]
        return queries, self.positions(self._seen - n, n)

    def observe(self, queries: torch.Tensor) -> None:
        """The newest step's queries, and of the earlier steps' only the newest task_tokens:
        all that is read (the prompt's last queries, or a probe taken back, fed in one step)."""
        most = self.method.task_tokens
        if len(self.observed) > 1 or (self.observed and self.observed[0].shape[-2] > most):
            self.observed = [torch.cat(self.observed, dim=-2)[..., -most:, :].clone()]
        super().observe(queries)

    def trim(self, n: int) -> int:
        held = sum(queries.shape[-2] for queries in self.observed)
        if min(n, self._fresh) > held:
            raise RuntimeError(f"am_task holds the queries of its newest {held} tokens; it cannot"
                               f" take back {n} as a probe")
        return super().trim(n)

    def scores(self) -> torch.Tensor:
        """One row shared by every head: the heads' mean."""
        return super().scores().mean(0, keepdim=True)

    def budget_tokens(self) -> int | None:
        m = self.method
        return None if m.ratio is None and m.budget is None else m.tokens(self._seen)

    def select(self, scores: torch.Tensor, keep: int | None) -> torch.Tensor:
        if keep is None:  # the MAD threshold decides how many
            return am_fit.mad_mask(scores, self.method.tau).nonzero().squeeze(-1).unsqueeze(0)
        return super().select(scores, keep)
