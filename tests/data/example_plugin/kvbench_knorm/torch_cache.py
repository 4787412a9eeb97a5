"""Knorm on torch: the scores; the rest is ScorerCache's."""
from kvbench.methods.settings import implements
from kvbench.methods.torch.token_cache import ScorerCache

from kvbench_knorm import Knorm


@implements(Knorm)  # a score-only method is its cache: the implementation is made from it
class KnormCache(ScorerCache):
    reads_queries = False  # scores come from the keys alone

    def protected(self, size):
        return self.method.keep_first, 0  # (sinks, window): kept whatever their scores

    def scores(self):
        # self.keys: (1, kv_heads, tokens, head_dim); scores: (kv_heads, tokens), higher kept
        return -self.keys[0].float().norm(dim=-1)
