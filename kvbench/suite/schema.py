"""The suite file's shape (pydantic models), its JSON schema, and pydantic errors as SuiteIssues.

Semantic checks (registry names, parameters, claims, models) live in expand.py; this file only
knows what keys and types a suite file may hold.
"""
from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from kvbench.backends.devices import DEVICE_FORMS, DEVICE_PATTERN, check_device_name
from kvbench.config.registry import did_you_mean
from kvbench.judge.tolerance import DEFAULT_TOLERANCE

SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("suite.schema.json")


class _Strict(BaseModel):
    # strict: YAML already has types, so "3" for an int is a mistake, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)


class ToleranceSpec(_Strict):
    """How far a metric may move in its worse direction; the larger of the two slacks applies."""

    abs: float | None = Field(None, ge=0, description="absolute slack, in the metric's unit")
    rel: float | None = Field(None, ge=0, description="relative slack: 0.05 is 5% of the baseline")

    @model_validator(mode="after")
    def _one_given(self):
        if self.abs is None and self.rel is None:
            raise ValueError("give abs and/or rel, e.g. {rel: 0.05}")
        return self


class Gate(_Strict):
    """Regression tolerances for comparing a run with a baseline."""

    default: ToleranceSpec | None = Field(
        None, description=f"for metrics not listed under metrics (default: rel {DEFAULT_TOLERANCE.rel})")
    metrics: dict[str, ToleranceSpec] = Field(default_factory=dict)
    absolute_timings: bool = Field(
        False, description="also gate absolute timings (ms, s, tok/s), each only when it moved "
                           "beyond its tolerance and significantly over the repeats; by default "
                           "only their same-run ratios are gated")


class Defaults(_Strict):
    """Settings every benchmark gets unless it overrides them."""

    model: str | None = Field(
        None, description="bundled:NAME | checkpoint path (relative to the suite file) | "
                          "tiny:KIND (kvbench list models) | hub id")
    device: str = Field(
        "auto", description=f"{DEVICE_FORMS}; auto: CUDA, else MPS, else the CPU",
        json_schema_extra={"pattern": DEVICE_PATTERN})
    backend: Literal["torch", "mlx"] = Field(
        "torch", description="torch (CPU/CUDA/MPS by device) or mlx (MLX, models on mlx-lm)")
    seed: int = 0
    repeats: int = Field(1, ge=1)
    timeout_s: float | None = Field(
        None, gt=0, description="seconds a case may run; null (the default): no limit")
    model_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the torch model's weights and activations, loaded in it (a "
                            "method's cache stores in this dtype unless its own dtype says "
                            "otherwise); auto: the checkpoint's own dtype on CUDA and MPS, "
                            "float32 on the CPU")
    max_context: int | None = Field(
        None, ge=1, description="tokens the model is good for, in place of what its config "
                                "says (max_position_embeddings, stretched by its rope scaling)")
    trust_remote_code: bool = Field(
        False, description="run a hub checkpoint's own modelling code (its config's auto_map):"
                           " only for a repository you trust")
    device_map: str | dict[str, str | int] | None = Field(
        None, description="accelerate's placement of a model larger than one device: auto, "
                          "balanced, sequential, or {module: device}; null: the whole model on "
                          "the case's device")
    max_memory: dict[str | int, str] | None = Field(
        None, description="with device_map: the most each device may hold, e.g. {0: 70GiB, "
                          "cpu: 200GiB}")
    system_prompt: str | None = Field(
        None, description="a system message before every question put to a chat model")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra arguments of the model's chat template, e.g. "
                                          "{enable_thinking: false} for Qwen3")
    threads: int | None = Field(
        None, ge=1, description="torch CPU threads for every case; null: torch's default. One "
                                "thread keeps timings steady on a shared machine")
    cpu_heap: Literal["keep", "release"] = Field(
        "keep", description="on a CPU (glibc), what a freed block of 1 MiB or more does: keep: "
                            "stays for reuse (fast; the resident peak counts it until reused); "
                            "release: goes back to the system at once, and the heap's free "
                            "pages at each forward's end, so peak_bytes and eval_overhead count "
                            "what the case holds, at 12-21% more prefill time "
                            "(docs/benchmarks.md#memory-footprint)")

    @field_validator("device")
    @classmethod
    def _device_form(cls, value: str) -> str:
        return check_device_name(value)  # whether it exists: asked where the case runs

    @model_validator(mode="after")
    def _torch_model_settings(self) -> "Defaults":
        if self.backend == "mlx":
            torch_only = [key for key in TORCH_MODEL_SETTINGS
                          if getattr(self, key) != type(self).model_fields[key].default]
            if self.model_dtype == "float32":  # what a suite written before auto said of any
                torch_only.remove("model_dtype")
            if torch_only:
                verb = "applies" if len(torch_only) == 1 else "apply"
                raise ValueError(f"{', '.join(torch_only)} {verb} to torch models; on mlx the"
                                 " model runs as mlx-lm loads it (leave it out)")
        if self.max_memory is not None and self.device_map is None:
            raise ValueError("max_memory is for device_map: set device_map (e.g. auto) too")
        return self


# what only a torch model is loaded with
TORCH_MODEL_SETTINGS = ("model_dtype", "device_map", "max_memory", "trust_remote_code")
# the settings added after suites were first stored: a suite's record (and so its hash, which
# --resume checks) holds them only where they are set
LATER_SETTINGS = ("model_dtype", "max_context", "trust_remote_code", "device_map",
                  "max_memory", "system_prompt", "chat_template_kwargs", "cpu_heap")


class MethodEntry(_Strict):
    name: str = Field(description="registry name or module:Class")
    label: str | None = Field(
        None, description="default: the name; each matrix key adds -<key><value>, e.g. intq-bits4")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the method's dataclass fields")
    matrix: dict[str, list[Any]] = Field(
        default_factory=dict, description="every combination, in the order written, is a variant")
    claims: list[str] = Field(
        default_factory=list, description="'metric op value', for every benchmark with the metric")


class ScopedClaim(_Strict):
    cases: str | None = Field(None, description="fnmatch glob on the case id, e.g. "
                              "'*intq-bits2*'; default: every case of the benchmark")
    claim: str = Field(description="'metric op value'")
    goal: str | None = Field(None, description="a goal not met yet, and why: a claim that fails"
                             " is reported as 'goal not met' with this reason, apart from the"
                             " failures, and does not fail the run")
    model: str | None = Field(
        None, exclude_if=lambda model: model is None,  # a suite's record as before it existed
        description="the model the claim's target was calibrated on (a model spec, e.g. "
                          "bundled:smollm2-135m): a case that runs another model does not judge"
                          " it, and records it as 'skipped' with the reason")


ClaimItem = Annotated[
    Annotated[str, Tag("text")] | Annotated[ScopedClaim, Tag("scoped")],
    Discriminator(lambda v: "scoped" if isinstance(v, (dict, ScopedClaim)) else "text"),
]


class BenchmarkEntry(_Strict):
    kind: str = Field(description="benchmark registry name")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the benchmark's Params fields")
    matrix: dict[str, list[Any]] = Field(default_factory=dict)
    methods: list[str] | None = Field(
        None, description="method labels or globs to run; default: all")
    model: str | None = None
    seed: int | None = None
    repeats: int | None = Field(None, ge=1)
    timeout_s: float | None = Field(None, gt=0)
    claims: list[ClaimItem] = Field(default_factory=list)


class SuiteFile(_Strict):
    """A kvbench suite. methods and benchmarks may come from included files; the suite as a
    whole needs at least one of each."""

    kvbench: Literal[SCHEMA_VERSION] = Field(description="schema version")  # type: ignore[valid-type]
    name: str | None = Field(None, description="default: the file name without .yaml")
    description: str | None = None
    include: list[str] = Field(
        default_factory=list, description="suite files, relative to this one, merged before it")
    defaults: Defaults = Field(default_factory=Defaults)
    gate: Gate = Field(default_factory=Gate)
    methods: list[MethodEntry] = Field(default_factory=list)
    benchmarks: list[BenchmarkEntry] = Field(default_factory=list)

    @field_validator("kvbench", mode="before")
    @classmethod
    def _not_a_boolean(cls, value):
        if isinstance(value, bool):  # True == 1 would pass as version 1
            raise ValueError(f"schema version {value!r} is not supported")
        return value


def suite_json_schema() -> dict:
    schema = SuiteFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"kvbench suite, version {SCHEMA_VERSION}"
    return schema


def schema_text() -> str:
    return json.dumps(suite_json_schema(), indent=2, sort_keys=True) + "\n"


def schema_issues(exc: ValidationError, data: Any) -> list[tuple[tuple, str, str]]:
    """(key path, message, hint) for each pydantic error, in the user's terms."""
    out = []
    for err in exc.errors():
        path = _data_path(err["loc"], data)
        out.append((path, *explain_error(err, path)))
    return out


def _data_path(loc: tuple, data: Any) -> tuple:
    """Drop the parts of pydantic's loc that are not keys of the data (union tags)."""
    path, node = [], data
    for index, part in enumerate(loc):
        last = index == len(loc) - 1
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif not (last and isinstance(node, dict)):  # a union's tag, not a missing key
            continue
        path.append(part)
    return tuple(path)


def explain_error(err: dict, path: tuple) -> tuple[str, str]:
    """(message, hint) for one pydantic error at `path`: "must be ..., got ..." and the like."""
    kind, got = err["type"], err.get("input")
    if kind == "extra_forbidden":
        allowed = _fields_at(path[:-1])
        hint = did_you_mean(path[-1], allowed).strip() or f"allowed: {', '.join(allowed)}"
        return f"unknown key {path[-1]!r}", hint
    if kind == "missing":
        return f"missing required key {path[-1]!r}", ""
    if path == ("kvbench",):
        return (f"schema version {got!r} is not supported",
                f"this kvbench reads `kvbench: {SCHEMA_VERSION}`")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping (key: value), got {_show(got)}", ""
    if kind == "value_error":
        return err["msg"].removeprefix("Value error, "), ""
    message = err["msg"].replace("Input should be", "must be", 1)
    return f"{message}, got {_show(got)}", ""


def _show(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a boolean"}
    name = names.get(type(value), type(value).__name__)
    return name if isinstance(value, (dict, list)) else f"{name} {value!r}"


def _fields_at(path: tuple) -> list[str]:
    """Field names of the model that sits at `path` in a suite file."""
    tp: Any = SuiteFile
    for part in path:
        tp = _step(_model_in(tp), part)
    tp = _model_in(tp)
    return list(tp.model_fields) if _is_model(tp) else []


def _model_in(tp: Any) -> Any:
    """The model inside Annotated[...] or a union (Optional[Model], str | ScopedClaim), or tp."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _model_in(args[0])
    if origin in (Union, types.UnionType):
        inner = [m for m in map(_model_in, args) if _is_model(m)]
        return inner[0] if inner else tp
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _step(tp: Any, part: Any) -> Any:
    """The type one step below `tp`, following a field name, a list index or a dict key."""
    if _is_model(tp):
        field = tp.model_fields.get(part)
        return field.annotation if field else None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return args[0]
    if origin is dict:
        return args[1]
    return None


if __name__ == "__main__":  # regenerate the committed schema: python -m kvbench.suite.schema
    SCHEMA_FILE.write_text(schema_text())
