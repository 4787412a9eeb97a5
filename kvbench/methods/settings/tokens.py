"""What every token-reduction method shares: its budget, a ratio of the prompt or a fixed number
of tokens per head, and the layout its ratios stand on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, at_least, between, param
from kvbench.methods.settings.base import Capabilities, MethodSettings


@dataclass
class TokenMethod(MethodSettings):
    """A token-reduction method: tokens a policy keeps per head after the prompt, `ratio` of the
    prompt or a fixed `budget` (set exactly one). Until end_prefill it holds every token, so it
    can take any of them back."""

    capabilities: ClassVar[Capabilities] = Capabilities(trim=True)
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = ({"ratio": 0.5}, {"budget": 9})
    scores_by_keys: ClassVar[bool] = True  # a scorer's tokens are chosen from their keys

    ratio: float | None = param(None, range=between(0, 1, low_open=True, high_open=True),
                                meaning="the fraction of the prompt's tokens kept per head")
    budget: int | None = param(None, range=at_least(1),
                               meaning="the number of tokens kept per head")

    def check(self) -> None:
        self.check_budget()

    def check_budget(self) -> None:
        if (self.ratio is None) == (self.budget is None):
            raise SettingError(None, "set exactly one of ratio (a fraction of the prompt) and"
                                     " budget (tokens per head)")

    def evicts_every_chunk(self) -> bool:
        """Whether the budget holds while the prompt is fed, from its first forward on."""
        return False

    def tokens(self, prompt: int) -> int:
        """Tokens to keep from a prompt of `prompt` tokens; refuses to keep all of them."""
        keep = self.budget if self.budget is not None else max(1, round(self.ratio * prompt))
        if keep >= prompt:
            raise ValueError(f"a budget of {keep} tokens keeps every one of the {prompt} prompt"
                             " tokens: nothing would be reduced; lower it or lengthen the prompt")
        return keep

    def describe(self) -> str:
        return (f"{self.ratio:g} of the prompt" if self.ratio is not None
                else f"{self.budget} tokens")

    def layout(self) -> str:
        return (f"{self.name}: keeps {self.describe()} per head at full precision;"
                " K and V both counted")
