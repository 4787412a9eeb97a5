"""What two versions of a suite share (from their resolved form, as results record it): claims
judge measurements and timeouts end cases, neither changes what a case measures. `kvbench run
--resume` continues a run whose suite changed only in those; `kvbench merge` joins runs whose
suites differ only in timeouts."""
from __future__ import annotations

import hashlib
import json
from typing import Any

CLAIMS, TIMEOUTS = "claims", "timeout_s"


def without(resolved: dict[str, Any], *keys: str) -> str:
    """The resolved suite as canonical JSON, without `keys` in its defaults, methods and
    benchmarks."""
    plain = json.loads(json.dumps(resolved, default=str))
    entries = [plain.get("defaults", {})] + plain.get("methods", []) + plain.get("benchmarks", [])
    for entry in entries:
        for key in keys:
            entry.pop(key, None)
    return json.dumps(plain, sort_keys=True)


def digest_without(resolved: dict[str, Any], *keys: str) -> str:
    return hashlib.sha256(without(resolved, *keys).encode()).hexdigest()


def timeouts(resolved: dict[str, Any]) -> list:
    return [resolved.get("defaults", {}).get(TIMEOUTS)] + [
        entry.get(TIMEOUTS) for entry in resolved.get("benchmarks", [])]
