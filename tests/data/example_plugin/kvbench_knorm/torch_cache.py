"""Knorm on torch: the scores; the rest is ScorerCache's."""
from kvbench.methods.settings import implements
from kvbench.methods.torch.token_cache import ScorerCache, TorchTokenMethod

from kvbench_knorm import Knorm


class KnormCache(ScorerCache):
    reads_queries = False  # scores come from the keys alone

    def protected(self, size):
        return self.method.keep_first, 0  # (sinks, window): kept whatever their scores

    def scores(self):
        # self.keys: (1, kv_heads, tokens, head_dim); scores: (kv_heads, tokens), higher kept
        return -self.keys[0].float().norm(dim=-1)


@implements(Knorm)
class TorchKnorm(TorchTokenMethod):
    cache = KnormCache
