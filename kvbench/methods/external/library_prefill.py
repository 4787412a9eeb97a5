"""The seam by which a library runs a prompt's first forward itself (kvpress: the press's hooks
on the model, over a cache of the library's own) and hands the cache it leaves to kvbench's
policies, which every later forward reads through."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any

from kvbench.methods.core.contracts import Implementation, LayerCachePolicy


class LibraryPrefill(Implementation):
    """A method whose prompt forward the library runs (kvbench.models.hf_cache calls
    prefill_forward for a cache's first forward)."""

    @abstractmethod
    def prefill_forward(self, model: Any, ids: Any, policies: list[LayerCachePolicy],
                        **kwargs) -> Any:
        """The model's output for `ids` (a prompt's first forward, (1, tokens) token ids) run as
        the library runs it, `kwargs` passed to the model's forward; then every layer's policy
        holds what the library's cache kept."""
