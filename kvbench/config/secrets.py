"""Secrets kvbench reads from the environment, never from a suite: a suite is recorded whole in
its results, and a results file is shared."""
from __future__ import annotations

import os

# The API key of a kvbench server: `kvbench serve` asks requests for it, the stress and
# perplexity benchmarks send it (kvbench.benchmarks.specs.server_target)
API_KEY_ENV = "KVBENCH_API_KEY"


def secret_from_env(name: str) -> str | None:
    """The value of environment variable `name`; None where it is unset or empty."""
    return os.environ.get(name) or None
