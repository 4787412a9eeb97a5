"""A kvbench method from another package: keep the tokens whose keys have the smallest norm."""
from dataclasses import dataclass

from kvbench.methods.settings import implements
from kvbench.methods.settings.tokens import TokenMethod
from kvbench.methods.torch.token_cache import ScorerCache, TorchTokenMethod


@dataclass
class Knorm(TokenMethod):
    """Keeps `ratio` of the prompt (or `budget` tokens) per head: the smallest key norms."""


class KnormCache(ScorerCache):
    reads_queries = False  # scores come from the keys alone

    def scores(self):
        return -self.keys[0].float().norm(dim=-1)  # (heads, tokens): small norms score high


@implements(Knorm)
class TorchKnorm(TorchTokenMethod):
    cache = KnormCache
