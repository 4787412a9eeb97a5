"""A kvbench method from another package: keep the tokens whose keys have the smallest norm."""
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, at_least, param
from kvbench.methods.settings import implements
from kvbench.methods.settings.tokens import TokenMethod
from kvbench.methods.torch.token_cache import ScorerCache, TorchTokenMethod


@dataclass
class Knorm(TokenMethod):
    """Keeps `ratio` of the prompt (or `budget` tokens) per head: the smallest key norms, and
    the first `keep_first` tokens whatever their norm."""

    # the settings kvbench.testing.check_method is run with by the plug-in's own test
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"ratio": 0.5}, {"budget": 9, "keep_first": 2})

    keep_first: int = param(0, range=at_least(0), meaning="tokens always kept, within the"
                            " budget")

    def check(self) -> None:  # rules across fields, after each field's type and range
        super().check()
        if self.budget is not None and self.keep_first >= self.budget:
            raise SettingError("keep_first", f"keep_first {self.keep_first} leaves nothing of"
                               f" the budget of {self.budget} to choose")


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
