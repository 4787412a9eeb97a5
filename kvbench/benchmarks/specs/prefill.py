"""The parameter every benchmark that prefills prompts declares alike: tokens per forward."""
from __future__ import annotations

from typing import Any

from kvbench.config.fields import at_least, param

PREFILL_CHUNK_MEANING = ("prompt tokens per prefill forward (a longer prompt is fed in several);"
                         " 0: from the model, the device's free memory and the prompt length"
                         " (kvbench.models.budgets: 128 to 8192). A method that must read the"
                         " prompt at once (kvpress's presses) takes it in one forward, recorded"
                         " as info.prefill_chunk 0")


def prefill_chunk_param() -> Any:
    return param(0, range=at_least(0), kw_only=True, meaning=PREFILL_CHUNK_MEANING)
