"""Tests of kvbench's optional parts skip, saying which extra to install, where it is absent."""
from __future__ import annotations

import pytest

from kvbench.config.extras import lacks


def require_extra(extra: str) -> None:
    """Skip the calling test module unless the extra's modules can be imported."""
    missing = lacks(extra, "this test module")
    if missing:
        pytest.skip(missing, allow_module_level=True)


def needs(extra: str) -> pytest.MarkDecorator:
    """Mark a test that runs only with the extra installed (skipped, saying so, without it)."""
    missing = lacks(extra, "this test")
    return pytest.mark.skipif(missing is not None, reason=missing or "")
