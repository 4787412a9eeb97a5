"""Shared fixtures.

The bundled model is prepared once per session (into KVBENCH_HOME if set, else the default home);
tests that use it are marked `model`.
"""
import sys
from pathlib import Path

import pytest
import torch

# One torch thread: with another process on the other core, two threads wait on each other at
# every barrier and the suite ran 10x slower (609 s against 53 s here); one costs 10% when idle.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # suites name tests.plugins.kvb_testplugin:...
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def bundled():
    """The bundled model as a LoadedModel, prepared on first use (about half a minute, once)."""
    from kvbench.models import load_model

    return load_model("bundled:smollm2-135m", "cpu")
