"""The benchmark contract and registry.

A benchmark is a class with a dataclass `Params` (its YAML parameters), a static table of the
metrics it reports (so claims and tolerances naming a metric are checked before anything runs),
`check` for impossible settings, and `run`, which measures one case.
"""
from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from kvbench.backends.arrays import ArrayBackend, array_backend
from kvbench.data.text import check_text, resolve_text
from kvbench.methods.base import Method
from kvbench.models.info import ModelInfo
from kvbench.registry import Registry
from kvbench.results import Direction, Metric, Timing


@dataclass(frozen=True)
class MetricSpec:
    unit: str
    direction: Direction
    description: str = ""
    # Varies run to run: recorded with its samples. "ratio" (to a reference timed in the same
    # repeat) is what the gate judges by default; "absolute" only when the suite asks.
    timing: Timing | None = None

    def of(self, value: float) -> Metric:
        return Metric(value=float(value), unit=self.unit, direction=self.direction,
                      timing=self.timing)

    def of_samples(self, samples: list[float]) -> Metric:
        return Metric.from_samples(samples, self.unit, self.direction, self.timing)


@dataclass
class RunContext:
    device: torch.device
    seed: int
    repeats: int
    model: str | None  # the suite's model spec; load it with load_model
    # (spec, device, backend="torch") -> LoadedModel, or MLXLoaded on mlx; cached by the runner
    load_model: Callable[..., Any]
    status: Callable[[str], None] = lambda message: None  # progress text for the current case
    backend: str = "torch"

    @functools.cached_property
    def arrays(self) -> ArrayBackend:
        """The backend's arrays: conversions, synchronised timing, a plain copy, the method's
        implementation on it (one per case)."""
        return array_backend(self.backend, self.device)


@dataclass
class BenchmarkOutput:
    metrics: dict[str, Metric]
    info: dict[str, Any] = field(default_factory=dict)
    # Must match for two runs of the case to be compared (e.g. {"tokens_sha256": ...}).
    comparable: dict[str, str] = field(default_factory=dict)


class Benchmark(ABC):
    name: ClassVar[str] = ""
    Params: ClassVar[type]
    metrics: ClassVar[dict[str, MetricSpec]]
    uses_model: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("torch",)  # array libraries it can measure on

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        """Params with file parameters made absolute against the suite's folder."""
        return params

    def check(self, params: Any, model: ModelInfo | None) -> None:
        """Raise ValueError(message) for a setting that cannot run (checked before any work)."""

    @abstractmethod
    def run(self, params: Any, method: Method, ctx: RunContext) -> BenchmarkOutput: ...


def check_at_least(params: Any, lows: dict[str, int]) -> None:
    """ValueError naming the first parameter below its least value (for Params.__post_init__)."""
    for name, low in lows.items():
        value = getattr(params, name)
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value!r}")


class TextModelBenchmark(Benchmark):
    """A benchmark that reads a text's tokens through the suite's model, on either backend.
    Its Params have `text` ("pydoc", a file relative to the suite, or an hf: source)."""

    uses_model = True
    backends = ("torch", "mlx")

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        return dataclasses.replace(params, text=resolve_text(params.text, base_dir))

    def check_text_and_model(self, params: Any, model: ModelInfo | None) -> None:
        """The start of every such check(): the text exists and a model is set."""
        check_text(params.text)
        if model is None:
            raise ValueError(f"{self.name} needs a model; set the suite's model")

    @staticmethod
    def check_length(model: ModelInfo, what: str, total: int) -> None:
        """ValueError when `total` tokens (`what` says how they add up) exceed what the model is
        good for."""
        if model.max_context is not None and total > model.max_context:
            raise ValueError(f"{what} = {total} tokens is above the {model.max_context} that"
                             f" model {model.spec} is good for")


BENCHMARKS: Registry[Benchmark] = Registry("benchmark", entry_point_group="kvbench.benchmarks")
register_benchmark = BENCHMARKS.register
