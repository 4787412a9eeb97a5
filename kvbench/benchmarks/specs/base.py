"""A benchmark's declaration, torch-free: its parameters (a settings dataclass whose fields
declare type, default, range and meaning), the metrics it reports (so claims and tolerances
naming a metric are checked before anything runs), what it needs of a method, the backends it
measures on, and check() for settings that cannot run with the suite's model. The measurement
itself (kvbench.benchmarks.measure) registers against the declaration with @measures.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from kvbench.benchmarks.records.base import OpenRecord, Record
from kvbench.config.fields import Settings, SettingError, at_least, param
from kvbench.config.registry import Registry
from kvbench.data.text import check_text, parse_hf_source, resolve_text
from kvbench.models.info import ModelInfo
from kvbench.reportkit.benchmark import BenchmarkReport
from kvbench.results import Direction, Metric, Timing


# How many vectors encoded weigh one token through a model in Benchmark.workload: a rough
# figure (a token passes every layer of the model, K and V, besides its own attention), good
# enough to rank a proof on 4096 vectors below a needle case on 4096 tokens.
VECTORS_PER_TOKEN = 1000


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


# A model-running case's memory (kvbench.models.footprint), recorded beside its benchmark's own
# metrics by kvbench.run.case; claims hold it (`eval_overhead <= 0.25`). Timing "absolute": shown,
# not gated by default. A peak moves with the allocator as a clock with the machine, and the
# caches' high water with Python's collector (a dropped cache counts until it is collected).
FOOTPRINT_METRICS = {
    "peak_bytes": MetricSpec(
        "bytes", "lower", "high-water mark during the case: process resident memory on CPU"
        " (model included), the allocator's on CUDA and MLX", timing="absolute"),
    "held_at_start_bytes": MetricSpec(
        "bytes", "none", "what the probe held when it was reset, the model loaded (the weights,"
        " the runtime)", timing="absolute"),
    "weights_bytes": MetricSpec("bytes", "none", "the model's parameters and buffers"),
    "cache_high_water_bytes": MetricSpec(
        "bytes", "lower", "the most the method's live caches held at once (accounted bytes,"
        " summed over the caches alive together)", timing="absolute"),
    "plain_cache_bytes": MetricSpec(
        "bytes", "none", "the plain cache's bytes of those caches at that moment (K/V of every"
        " token seen, at the model's dtype)", timing="absolute"),
    "eval_overhead_bytes": MetricSpec(
        "bytes", "lower", "what kvbench's evaluation held at the peak above the start and the"
        " caches at their largest: peak_bytes - held_at_start_bytes - cache_high_water_bytes",
        timing="absolute"),
    "eval_overhead": MetricSpec(
        "", "lower", "eval_overhead_bytes / plain_cache_bytes", timing="absolute"),
}


class Benchmark:
    """Base of every benchmark's declaration (registered by name with register_benchmark)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type]
    metrics: ClassVar[dict[str, MetricSpec]]
    # what kvbench.run.case records beside them (a model-running case's footprint), which
    # claims and the gate may name as well (known_metrics)
    recorded_metrics: ClassVar[dict[str, MetricSpec]] = {}
    uses_model: ClassVar[bool] = False
    # measures a method's codecs alone: a claim on a method whose cache does more is refused
    codecs_only: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("torch",)  # array libraries it can measure on
    extras: ClassVar[tuple[str, ...]] = ()  # kvbench extras it needs (kvbench.config.extras)
    # the module whose import registers what measures it (@measures); None: it has run() itself
    measured_in: ClassVar[str | None] = None
    # parameter -> (method capability it needs, the value that needs none or a test of the
    # params that says they need none): checked against each method's supports() when a suite
    # is validated (kvbench.methods.settings.base.Capabilities)
    needs: ClassVar[dict[str, tuple[str, Any]]] = {}
    # its part of the report: the sections after its table in report.md (with their figures),
    # its leaderboard's columns on the results page, its metrics in the by-method table; the
    # generic one has none of them (kvbench.reportkit.benchmark)
    report: ClassVar[BenchmarkReport] = BenchmarkReport()
    # what its measurement writes into a case's info, which its report reads back: checked
    # as each case ends (kvbench.benchmarks.records); a plug-in's that declares none: any keys
    record: ClassVar[type[Record]] = OpenRecord

    def head_dim(self, params: Any, model: ModelInfo | None) -> int | None:
        """The width of the vectors a method encodes in a case (None: unknown)."""
        return model.head_dim if model is not None else None

    def workload(self, params: Any) -> float:
        """About how much a case of these params does, in tokens run through the model
        (vectors encoded count VECTORS_PER_TOKEN to a token): what kvbench.run.cost orders the
        queue and balances shards by. This default reads the usual fields, samples x (length or
        context); a benchmark shaped otherwise says its own."""
        samples = getattr(params, "samples", None) or 1
        tokens = getattr(params, "length", None) or getattr(params, "context", None) or 1
        return float(samples * tokens)

    def resolve_paths(self, params: Any, base_dir: Path) -> Any:
        """Params with file parameters made absolute against the suite's folder."""
        return params

    def check(self, params: Any, model: ModelInfo | None) -> None:
        """Raise SettingError(parameter, message) for a setting that cannot run (checked before
        any work)."""

    def check_text_and_model(self, text: str, model: ModelInfo | None,
                             field: str = "text") -> None:
        """The start of a check() of a benchmark that reads a text through the model: the text
        exists and a model is set."""
        try:
            check_text(text)
        except ValueError as exc:
            raise SettingError(field, str(exc)) from None
        self.require_model(model)

    def require_model(self, model: ModelInfo | None) -> ModelInfo:
        """The model a check() that reads through it goes on with. A suite without one is
        refused before check() runs; this is for check()'s other callers."""
        if model is None:
            raise SettingError(None, f"{self.name} needs a model; set the suite's model")
        return model

    @staticmethod
    def check_length(model: ModelInfo, what: str, total: int, *fields: str) -> None:
        """SettingError at the first of `fields` a suite sets when `total` tokens (`what` says
        how they add up) exceed what the model is good for."""
        if model.max_context is not None and total > model.max_context:
            raise SettingError(fields, f"{what} = {total} tokens is above the"
                                       f" {model.max_context} that model {model.spec} is good"
                                       f" for ({model.context_from}); the suite's max_context:"
                                       " sets another limit")


def known_metrics(benchmark_cls: type) -> dict[str, MetricSpec]:
    """Every metric a case of the benchmark may carry: its own, then those the case runner
    records beside them (a metric it reports itself is its own); a plug-in's class that is no
    Benchmark has its own alone."""
    own = benchmark_cls.metrics
    recorded = getattr(benchmark_cls, "recorded_metrics", {})
    return {**own, **{name: spec for name, spec in recorded.items() if name not in own}}


@dataclass(kw_only=True)
class TextWindowParams(Settings):
    """The text parameters of a benchmark that reads a text's tokens through the suite's model
    (parity, quality, perplexity, ladder), which its Params inherit."""

    text: str = param("pydoc", meaning='"pydoc", a text file, or'
                      ' "hf:<dataset>[:<config>]:<split>:<column>"')
    offset: int = param(0, range=at_least(0), meaning="token offset into the tokenised text")
    calibration: int = param(512, range=at_least(0), meaning="tokens right after the measured"
                             " ones, handed to methods that calibrate themselves (never the"
                             " measured tokens)")

    def check(self) -> None:
        if self.text.startswith("hf:"):
            try:
                parse_hf_source(self.text)  # a malformed source is refused before anything runs
            except ValueError as exc:
                raise SettingError("text", str(exc)) from None


class ModelBenchmark(Benchmark):
    """A benchmark that runs the suite's model, on either backend."""

    uses_model = True
    backends = ("torch", "mlx")
    recorded_metrics = FOOTPRINT_METRICS

    def check(self, params: Any, model: ModelInfo | None) -> None:
        self.require_model(model)


class TextModelBenchmark(ModelBenchmark):
    """A benchmark that reads a text's tokens through the suite's model. Its Params are
    TextWindowParams."""

    def resolve_paths(self, params: TextWindowParams, base_dir: Path) -> TextWindowParams:
        return dataclasses.replace(params, text=resolve_text(params.text, base_dir))

    def check(self, params: TextWindowParams, model: ModelInfo | None) -> None:
        self.check_text_and_model(params.text, model)
        read = self.tokens_read(params)
        if read is not None:
            what, total, fields = read
            self.check_length(model, what, total, *fields)

    def tokens_read(self, params: Any) -> tuple[str, int, tuple[str, ...]] | None:
        """(how the tokens it reads through the model add up, their number, the fields to
        blame), refused past the model's context; None: no limit."""
        return None


# The built-in benchmarks, each in its module of kvbench.benchmarks.specs, imported when the
# name is first looked up; plug-ins add theirs by the `kvbench.benchmarks` entry-point group.
BUILTIN_BENCHMARKS = ("compaction", "dataset", "decode_attention", "ladder", "multiturn", "niah",
                      "parity", "perplexity", "proofs", "quality", "ruler", "speed", "stress")
BENCHMARKS: Registry[Benchmark] = Registry(
    "benchmark", entry_point_group="kvbench.benchmarks",
    builtins={name: f"kvbench.benchmarks.specs.{name}" for name in BUILTIN_BENCHMARKS})
register_benchmark = BENCHMARKS.register

# ---- measurements, registered against the exact declaration -----------------------------------

_MEASUREMENTS: dict[type, Callable[[], Any]] = {}


def measures(*benchmark_classes: type) -> Callable[[type], type]:
    """Register the decorated class (a Benchmark with run(params, method, ctx)) as what measures
    exactly `benchmark_classes`."""
    def register(cls: type) -> type:
        for benchmark_cls in benchmark_classes:
            _MEASUREMENTS[benchmark_cls] = cls
        return cls
    return register


def registered_measurement(benchmark_cls: type) -> Callable[[], Any] | None:
    return _MEASUREMENTS.get(benchmark_cls)
