"""What validation knows about a model without loading its weights."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelInfo:
    spec: str  # as written in the suite: bundled:NAME, a checkpoint path, tiny:NAME or a hub id
    max_context: int | None  # tokens the model is good for; longer settings are refused
