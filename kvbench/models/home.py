"""Where kvbench keeps what it builds (bundled checkpoints): KVBENCH_HOME, else the XDG cache."""
from __future__ import annotations

import os
from pathlib import Path


def kvbench_home() -> Path:
    if os.environ.get("KVBENCH_HOME"):
        return Path(os.environ["KVBENCH_HOME"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "kvbench"
    return Path.home() / ".cache" / "kvbench"
