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
from kvbench.data.text import check_text, parse_hf_source, resolve_text, token_window
from kvbench.memo import Memo
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
    # What the run's cases share (tokenised texts, references): the runner's, one per run; a
    # fresh one for a context made outside a run.
    memo: Memo = field(default_factory=Memo)
    # Keeps one per-sample record (a prediction and its score) beside the results, in the run's
    # predictions.jsonl: what a surprising score is read from. Dropped outside a run.
    keep: Callable[[dict[str, Any]], None] = lambda record: None
    # A folder beside the run's results for files a case keeps (a server's log): made on first
    # use by whoever writes there; None outside a run.
    files_dir: Path | None = None

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
    # parameter -> (method capability it needs, the value that needs none): checked against
    # each method's supports() when a suite is validated (kvbench.methods.base.Capabilities)
    needs: ClassVar[dict[str, tuple[str, Any]]] = {}

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        """Params with file parameters made absolute against the suite's folder."""
        return params

    def check(self, params: Any, model: ModelInfo | None) -> None:
        """Raise ValueError(message) for a setting that cannot run (checked before any work)."""

    @abstractmethod
    def run(self, params: Any, method: Method, ctx: RunContext) -> BenchmarkOutput: ...

    def check_text_and_model(self, text: str, model: ModelInfo | None) -> None:
        """The start of a check() of a benchmark that reads a text through the model: the text
        exists and a model is set."""
        check_text(text)
        if model is None:
            raise ValueError(f"{self.name} needs a model; set the suite's model")

    @staticmethod
    def check_length(model: ModelInfo, what: str, total: int) -> None:
        """ValueError when `total` tokens (`what` says how they add up) exceed what the model is
        good for."""
        if model.max_context is not None and total > model.max_context:
            raise ValueError(f"{what} = {total} tokens is above the {model.max_context} that"
                             f" model {model.spec} is good for")


def check_at_least(params: Any, lows: dict[str, int]) -> None:
    """ValueError naming the first parameter below its least value (for Params.__post_init__)."""
    for name, low in lows.items():
        value = getattr(params, name)
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value!r}")


@dataclass(kw_only=True)
class TextWindowParams:
    """The text parameters of a TextModelBenchmark (parity, quality, perplexity), which its
    Params inherit:

    text: str = "pydoc" — "pydoc", a text file, or "hf:<dataset>[:<config>]:<split>:<column>".
    offset: int = 0 — token offset into the tokenised text.
    calibration: int = 512 — tokens right after the measured ones, handed to methods that
        calibrate themselves (never the measured tokens).
    """

    text: str = "pydoc"
    offset: int = 0
    calibration: int = 512

    def __post_init__(self):
        check_at_least(self, {"offset": 0, "calibration": 0})
        if self.text.startswith("hf:"):
            parse_hf_source(self.text)  # a malformed source is refused before anything runs


class TextModelBenchmark(Benchmark):
    """A benchmark that reads a text's tokens through the suite's model, on either backend.
    Its Params are TextWindowParams."""

    uses_model = True
    backends = ("torch", "mlx")

    def resolve_paths(self, params: TextWindowParams, base_dir: Path) -> TextWindowParams:
        return dataclasses.replace(params, text=resolve_text(params.text, base_dir))

    @staticmethod
    def read_window(ctx: RunContext, session: Any, params: TextWindowParams,
                    need: int) -> tuple[list[int], list[int]]:
        """(`need` tokens of the text from its offset, the calibration tokens right after them:
        as many of params.calibration as the text has)."""
        window, after = token_window(ctx.memo, session, params.text, params.offset, need)
        return window, after[: params.calibration]



BENCHMARKS: Registry[Benchmark] = Registry("benchmark", entry_point_group="kvbench.benchmarks")
register_benchmark = BENCHMARKS.register
