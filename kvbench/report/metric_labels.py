"""What the results page calls a metric: its name, unit and direction, and, for a ratio of
bytes, what it is a ratio to. A compression ratio against 16-bit K/V reads 0.5 for a float32
model's own cache; the label says so instead of leaving the reader to guess. The reference is
read from the benchmark's own description of the metric (its MetricSpec), so a plug-in's
metric of the same name is labelled by what it declares."""
from __future__ import annotations

from kvbench.benchmarks import BENCHMARKS
from kvbench.benchmarks.specs.base import known_metrics

ARROWS = {"higher": "↑", "lower": "↓"}
SIXTEEN_BIT = "vs 16-bit K/V"  # the built-ins' compression_ratio: "16-bit K+V ... / ..."
OWN_CACHE = "vs the model's own cache"  # retained_kv: "... / the plain cache's ... bytes"


def metric_description(kind: str, name: str) -> str:
    """The benchmark's description of the metric; "" when it cannot be looked up here."""
    try:
        spec = known_metrics(BENCHMARKS.get(kind)).get(name)
    except Exception:  # a plug-in not installed where the page is made: the results suffice
        return ""
    return getattr(spec, "description", "") or ""


def reference(kind: str, name: str) -> str | None:
    """What a ratio of bytes is against ("vs 16-bit K/V"), from its description; else None."""
    description = metric_description(kind, name)
    if description.startswith("16-bit"):
        return SIXTEEN_BIT
    if "/ the plain cache" in description:
        return OWN_CACHE
    return None


def metric_label(kind: str, name: str, unit: str, direction: str) -> str:
    """`compression_ratio × vs 16-bit K/V ↑`, `score [%] ↑`: the name first, as in the results."""
    against = reference(kind, name)
    if against is not None and unit in ("x", ""):
        shown = f"{name} × {against}"
    else:
        shown = f"{name} [{unit}]" if unit else name
    arrow = ARROWS.get(direction)
    return f"{shown} {arrow}" if arrow else shown
