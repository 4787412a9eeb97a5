"""Tests of kvbench's optional parts skip, saying which extra to install, where it is absent."""
from __future__ import annotations

import pytest

from kvbench.config.extras import lacks


def require_extra(extra: str) -> None:
    """Skip the calling test module unless the extra's modules can be imported."""
    missing = lacks(extra, "this test module")
    if missing:
        pytest.skip(missing, allow_module_level=True)


def method_extra_missing(settings_cls: type) -> str | None:
    """Why a method's settings cannot be built here (the extra its implementation needs is
    absent, with the install line), or None."""
    return lacks(settings_cls.extra, f"method {settings_cls.name!r}") if settings_cls.extra \
        else None


def needs(extra: str) -> pytest.MarkDecorator:
    """Mark a test that runs only with the extra installed (skipped, saying so, without it)."""
    missing = lacks(extra, "this test")
    return pytest.mark.skipif(missing is not None, reason=missing or "")
