"""Tests of kvbench's optional parts skip, saying which extra to install, where it is absent."""
from __future__ import annotations

import pytest

from kvbench.config.extras import lacks


def require_extra(extra: str) -> None:
    """Skip the calling test module unless the extra's modules can be imported."""
    missing = lacks(extra, "this test module")
    if missing:
        pytest.skip(missing, allow_module_level=True)
