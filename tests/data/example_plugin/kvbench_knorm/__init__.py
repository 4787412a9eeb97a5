"""A kvbench method from another package: keep the tokens whose keys have the smallest norm.
Its settings, torch-free (a suite naming it validates without torch); the torch implementation is
in kvbench_knorm.torch_cache."""
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbench.config.fields import SettingError, at_least, param
from kvbench.methods.settings.tokens import TokenMethod


@dataclass
class Knorm(TokenMethod):
    """Keeps `ratio` of the prompt (or `budget` tokens) per head: the smallest key norms, and
    the first `keep_first` tokens whatever their norm."""

    # the settings kvbench.testing.check_method is run with by the plug-in's own test
    conformance_params: ClassVar[tuple[dict[str, Any], ...]] = (
        {"ratio": 0.5}, {"budget": 9, "keep_first": 2})
    # imported when kvbench first builds it on torch
    implemented_in: ClassVar[dict[str, str]] = {"torch": "kvbench_knorm.torch_cache"}

    keep_first: int = param(0, range=at_least(0), meaning="tokens always kept, within the"
                            " budget")

    def check(self) -> None:  # rules across fields, after each field's type and range
        super().check()
        if self.budget is not None and self.keep_first >= self.budget:
            raise SettingError("keep_first", f"keep_first {self.keep_first} leaves nothing of"
                               f" the budget of {self.budget} to choose")
