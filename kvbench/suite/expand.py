"""Methods x benchmarks -> Cases, checking on the way what the schema cannot: registry names,
parameters, claims, selectors, models, the number of cases, and each benchmark's own `check`.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar


from kvbench.benchmarks import BENCHMARKS
from kvbench.benchmarks.specs.base import known_metrics
from kvbench.config.extras import lacks
from kvbench.config.fields import SettingError
from kvbench.config.registry import Registry, did_you_mean
from kvbench.judge.claims import Claim
from kvbench.methods import METHODS, has_implementation
from kvbench.models.info import ModelInfo, method_refusal
from kvbench.suite.case import Case
from kvbench.suite.errors import Issues, Placed
from kvbench.suite.models import ModelDescriber, model_options, model_spec
from kvbench.suite.names import (
    bench_claims, check_metric, check_reference, check_scopes, check_unseen_policy, lookup, parse,
)
from kvbench.suite.overrides import UNFIT, Changes
from kvbench.suite.params import Unavailable, blame, matrix_combos, settings_of, value_text
from kvbench.suite.schema import BenchmarkEntry, Defaults, MethodEntry

T = TypeVar("T")
MAX_CASES = 10_000  # a suite expanding to more is a mistake (a matrix too many), not a plan


@dataclass
class _Variant:
    """One method setting: an entry of `methods:` with one combination of its matrix."""

    entry: Placed[MethodEntry]
    cls: type | None  # None: an unknown method
    label: str
    params: dict[str, Any] | None  # None: the method or these params are invalid
    claims: list[Placed[Claim]] = field(default_factory=list)
    method: Any = None  # the configured method (None when params is, or when refused)
    refused: str | None = None  # why its cases cannot run here (its library is missing)


def expand_cases(
    methods: list[Placed[MethodEntry]],
    benchmarks: list[Placed[BenchmarkEntry]],
    defaults: Defaults,
    default_model: Placed[str] | None,
    issues: Issues,
    changes: Changes | None = None,
) -> list[Case]:
    """Every case, in the order written: benchmarks, each one's matrix, then methods.

    Problems go to `issues`; the cases of a broken entry are left out. The number of cases is
    counted from the matrix sizes first: a suite above MAX_CASES is refused unexpanded.
    `changes`: what the caller changed (kvbench.suite.overrides): on a swapped default model, a
    suite setting the model cannot hold refuses its cases rather than failing the suite.
    """
    changes = changes or Changes()
    sizes = [_size(m.value.matrix) for m in methods]
    if _too_many(methods, sizes, "method variants", issues):
        return []
    variants = _method_variants(methods, METHODS, issues)
    _check_implementations(variants, defaults.backend, issues)
    selections = [_select(bench, variants, issues) for bench in benchmarks]
    # A benchmark's matrix is expanded to check its params even when it runs no method.
    sizes = [_size(b.value.matrix) * max(1, len(c)) for b, c in zip(benchmarks, selections)]
    if _too_many(benchmarks, sizes, "cases", issues):
        return []
    describe = ModelDescriber(issues, defaults)
    cases: list[Case] = []
    made_by: dict[str, Placed[BenchmarkEntry]] = {}
    first: dict[str, Case] = {}  # case id -> the case, as its first entry made it
    metrics_of: dict[str, set[str] | None] = {}  # label -> metrics of the benchmarks running it
    for bench, chosen in zip(benchmarks, selections):
        cls = lookup(BENCHMARKS, bench.value.kind, bench.doc, bench.at("kind"), issues)
        for case in _bench_cases(bench, cls, chosen, defaults, default_model, describe, issues,
                                 changes):
            if made_by.get(case.id) is bench:
                issues.add(bench.doc, bench.path, f"case id {case.id!r} is produced twice here",
                           "a matrix value or a method label is repeated")
            elif changes.same_case(bench, case, first.get(case.id)):
                continue  # --set made two entries alike: the case runs once
            elif case.id in made_by:
                issues.add(bench.doc, bench.path,
                           f"case id {case.id!r} is also produced by {made_by[case.id].where()}",
                           "give the two different matrix values or methods")
            made_by.setdefault(case.id, bench)
            first.setdefault(case.id, case)
            cases.append(case)
        metrics = None if cls is None else set(known_metrics(cls))
        for variant in chosen:
            known = metrics_of.get(variant.label, set())
            both = None if known is None or metrics is None else known | metrics
            metrics_of[variant.label] = both
    for variant in variants:
        metrics = metrics_of.get(variant.label)
        if metrics is not None:  # not run, or run by an unknown benchmark: nothing to check
            for claim in variant.claims:
                check_metric(claim, metrics, "the benchmarks running this method do not report",
                             issues)
    return cases


# ---- methods ----------------------------------------------------------------------------------

def _method_variants(methods: list[Placed[MethodEntry]], registry: Registry,
                     issues: Issues) -> list[_Variant]:
    variants: list[_Variant] = []
    for placed in methods:
        entry = placed.value
        cls = lookup(registry, entry.name, placed.doc, placed.at("name"), issues)
        claims = [parse(text, placed.doc, placed.at("claims", i), issues)
                  for i, text in enumerate(entry.claims)]
        combos = matrix_combos(entry.matrix)
        settings = (settings_of(cls, placed, f"method {entry.name!r}", issues) if cls
                    else [None] * len(combos))
        base = entry.label or entry.name.rpartition(":")[2]  # module:Class -> Class
        kept = [c for c in claims if c is not None]
        for combo, instance in zip(combos, settings, strict=True):
            label = base + "".join(f"-{k}{value_text(v)}" for k, v in combo.items())
            if isinstance(instance, Unavailable):
                variants.append(_Variant(placed, cls, label, instance.params, kept,
                                         refused=instance.reason))
                continue
            variants.append(_Variant(
                placed, cls, label, None if instance is None else dataclasses.asdict(instance),
                kept, instance,
            ))
    first: dict[str, _Variant] = {}
    for variant in variants:
        other = first.setdefault(variant.label, variant)
        if other is variant:
            continue
        if other.entry is variant.entry:
            issues.add(variant.entry.doc, variant.entry.at("matrix"),
                       f"method label {variant.label!r} is made twice here",
                       "a matrix value is repeated")
        else:
            issues.add(variant.entry.doc, variant.entry.path,
                       f"method label {variant.label!r} is also used by {other.entry.where()}",
                       "give one of them a `label:`")
    return variants


def _check_implementations(variants: list[_Variant], backend: str, issues: Issues) -> None:
    """Every method must run on the suite's backend: on mlx, have an MLX implementation (and MLX
    be installed; kvbench's MLX methods import torch, so without it this is not checked); on
    torch, not be declared for no torch device (a method of the MLX backend only, e.g. mlx-lm's
    caches)."""
    if not variants:
        return
    try:
        supported = {v.cls: _runs_on(v.cls, backend) for v in variants if v.cls is not None}
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "torch":  # without torch: not checked here
            first = variants[0].entry
            issues.add(first.doc, ("defaults", "backend"), f"backend 'mlx' needs MLX ({exc})",
                       "pip install 'kvbench[mlx]' (on Linux: mlx[cpu]), or use backend: torch")
        return
    other = "torch" if backend == "mlx" else "mlx"
    seen = set()
    for variant in variants:
        entry = variant.entry
        if entry.path in seen:
            continue
        seen.add(entry.path)
        if variant.cls is not None and not supported[variant.cls]:
            issues.add(entry.doc, entry.at("name"),
                       f"method {entry.value.name!r} has no {backend} implementation",
                       f"run it with backend: {other}")


def _runs_on(cls: type, backend: str) -> bool:
    if backend == "mlx":
        return has_implementation(cls, "mlx")
    capabilities = getattr(cls, "capabilities", None)  # None: a stand-in, not checked
    return capabilities is None or bool(capabilities.devices)


def _select(bench: Placed[BenchmarkEntry], variants: list[_Variant], issues: Issues):
    """The method variants a benchmark runs, in the suite's method order."""
    selectors = bench.value.methods
    if selectors is None:
        return variants
    labels = [v.label for v in variants]
    for i, pattern in enumerate(selectors):
        if not any(fnmatch.fnmatchcase(label, pattern) for label in labels):
            hint = did_you_mean(pattern, labels).strip() or f"method labels: {', '.join(labels)}"
            issues.add(bench.doc, bench.at("methods", i),
                       f"{pattern!r} matches no method label", hint)
    return [v for v in variants if any(fnmatch.fnmatchcase(v.label, p) for p in selectors)]


# ---- benchmarks -------------------------------------------------------------------------------

def _bench_cases(bench: Placed[BenchmarkEntry], cls: type | None, chosen: list[_Variant],
                 defaults: Defaults, default_model: Placed[str] | None, describe,
                 issues: Issues, changes: Changes) -> list[Case]:
    """The cases of one benchmark entry; `cls` is its class (None: an unknown kind)."""
    entry = bench.value
    claims = bench_claims(bench, cls, issues)
    combos = matrix_combos(entry.matrix)
    suffixes = ["/" + ",".join(f"{k}={value_text(v)}" for k, v in c.items()) if c else ""
                for c in combos]
    ids = [_case_id(entry, v.label, s) for s in suffixes for v in chosen]
    check_scopes(bench, claims, ids, issues, changed=changes.changed(bench))
    labels = [v.label for v in chosen]
    known = None if cls is None else known_metrics(cls)
    for claim in [c for c, _, _ in claims] + [c for v in chosen for c in v.claims
                                              if known is None or c.value.metric in known]:
        check_reference(claim, labels, entry.kind, issues)
    if cls is None:
        return []
    if defaults.backend not in cls.backends:
        issues.add(bench.doc, bench.at("kind"),
                   f"benchmark {entry.kind!r} does not run on backend {defaults.backend!r}",
                   f"it runs on: {', '.join(cls.backends)}")
        return []
    missing = [lacks(extra, f"benchmark {entry.kind!r}") for extra in cls.extras]
    if any(missing):
        for message in filter(None, missing):
            issues.add(bench.doc, bench.at("kind"), message)
        return []
    model = Placed(entry.model, bench.doc, bench.at("model")) if entry.model else default_model
    info, model_ok = describe(model) if model else (None, not cls.uses_model)
    if cls.uses_model and model is None:
        issues.add(bench.doc, bench.at("kind"), f"benchmark {entry.kind!r} needs a model",
                   "set defaults.model, or model: on this benchmark, e.g. tiny:llama")
    cases = []
    benchmark = cls()
    load_options, chat = model_options(defaults, info)
    spec = model_spec(model) if model else None
    swapped = changes.model and not entry.model  # the suite's settings were not written for it

    def case(variant: _Variant, suffix: str, bench_params: dict[str, Any],
             refused: str | None, refused_as: str = "LibraryMissing", params=None) -> Case:
        case_id = _case_id(entry, variant.label, suffix)
        return Case(
            id=case_id, benchmark=entry.kind, bench_params=bench_params,
            method=variant.entry.value.name, method_label=variant.label,
            method_params=variant.params,
            model=spec,
            device=defaults.device,
            seed=_first(entry.seed, defaults.seed),
            repeats=_first(entry.repeats, defaults.repeats),
            timeout_s=_first(entry.timeout_s, defaults.timeout_s),
            backend=defaults.backend,
            threads=defaults.threads,
            cpu_heap=defaults.cpu_heap,
            model_dtype=defaults.model_dtype,
            model_revision=info.revision if info else None,
            load_options=load_options,
            chat=chat,
            refused=refused,
            refused_as=refused_as,
            params=params,
            settings=variant.method,
            claims=[c.value.on_model(spec) for c in variant.claims
                    if c.value.metric in known]
            + [c.value.on_model(spec) for c, pattern, _ in claims
               if pattern is None or fnmatch.fnmatchcase(case_id, pattern)],
        )

    settings = settings_of(cls.Params, bench, f"benchmark {entry.kind!r}", issues)
    for combo, suffix, params in zip(combos, suffixes, settings, strict=True):
        if isinstance(params, Unavailable):  # the library the benchmark's settings name
            cases += [case(variant, suffix, params.params, params.reason) for variant in chosen
                      if variant.params is not None]
            continue
        if params is None:
            continue
        params = benchmark.resolve_paths(params, Path(bench.doc.file).parent)
        if model_ok:  # a missing or unusable model was reported already
            try:
                benchmark.check(params, info)
            except ValueError as exc:  # a plug-in's check may raise a plain ValueError
                fields = exc.fields if isinstance(exc, SettingError) else ()
                unfit = changes.unfit(swapped, spec, bench.doc, blame(fields, combo, bench),
                                      str(exc), issues)
                cases += [case(variant, suffix, dataclasses.asdict(params), unfit, UNFIT, params)
                          for variant in chosen if unfit and variant.params is not None]
                continue
        needed = _needs(cls, params, defaults)
        head_dim = benchmark.head_dim(params, info) if model_ok else None
        for variant in chosen:
            if variant.params is None or not _supported(variant, needed, combo, bench, issues):
                continue
            misfit = _fits(variant, head_dim, bench) if head_dim is not None else None
            unfit = misfit and changes.unfit(swapped, spec, variant.entry.doc, *misfit, issues)
            if misfit and not unfit:
                continue
            unsupported = None if variant.refused or unfit or not (model_ok and cls.uses_model) \
                else _layer_refusal(variant, info, defaults.backend, describe)
            refused_as = (UNFIT if unfit and not variant.refused else "LayersUnsupported"
                          if unsupported else "LibraryMissing")
            cases.append(case(variant, suffix, dataclasses.asdict(params),
                              variant.refused or unfit or unsupported, refused_as, params))
            check_unseen_policy(entry.kind, cls, variant, cases[-1].id, claims, issues)
    return cases


def _case_id(entry: BenchmarkEntry, label: str, suffix: str) -> str:
    """kind/label and the matrix suffix; then @ the benchmark's own model where it names one (a
    suite may run a benchmark on several models): the spec, or a checkpoint folder's name."""
    model = entry.model
    if model and not model.startswith(("bundled:", "tiny:")):
        model = Path(model).name or model
    return f"{entry.kind}/{label}{suffix}" + (f"@{model}" if model else "")


def _needs(cls: type, params: Any, defaults: Defaults) -> list[tuple[str, str | None, str]]:
    """(capability, parameter or None, why) a benchmark's settings ask of every method: its
    `needs` (parameter -> (capability, the value that needs nothing)) and the device."""
    needed = [(capability, name, f"{name}: {value_text(getattr(params, name))}")
              for name, (capability, neutral) in getattr(cls, "needs", {}).items()
              if not (neutral(params) if callable(neutral) else getattr(params, name) == neutral)]
    device = defaults.device.partition(":")[0]
    if device not in ("auto", "cpu"):
        needed.append((device, None, f"device: {defaults.device}"))
    return needed


def _supported(variant: _Variant, needed: list[tuple[str, str | None, str]], combo: dict,
               bench: Placed[BenchmarkEntry], issues: Issues) -> bool:
    """Whether the method supports what the benchmark asks of it; if not, the issue is at the
    benchmark parameter that asks."""
    supports = getattr(variant.method, "supports", None)
    if supports is None:  # a stand-in without declared capabilities: not checked
        return True
    capabilities = supports()
    ok = True
    for capability, name, why in needed:
        if capabilities.lacks(capability):
            path = blame((name,), combo, bench) if name else bench.at("kind")
            issues.add(bench.doc, path,
                       f"method {variant.label!r} does not support {capability!r}, which {why}"
                       " needs", "drop the method from this benchmark (methods:) or the setting")
            ok = False
    return ok


def _fits(variant: _Variant, head_dim: int, bench: Placed[BenchmarkEntry]
          ) -> tuple[tuple, str] | None:
    """None where the method's configuration holds vectors of the case's head_dim; else (the
    path of the method's setting that does not fit, why)."""
    check = getattr(variant.method, "check_head_dim", None)
    if check is None:  # a stand-in without the check: not checked
        return None
    try:
        check(head_dim)
    except SettingError as exc:
        return (blame(exc.fields, {}, variant.entry), f"method {variant.label!r}: {exc} (head_dim"
                f" {head_dim} in benchmark {bench.value.kind!r})")
    return None


def _layer_refusal(variant: _Variant, info: ModelInfo, backend: str,
                   describe: ModelDescriber) -> str | None:
    """Why the method cannot run on the model's layers (kvbench.models.layer_kinds), naming the
    layers, or on backend mlx why mlx-lm would run the model otherwise than torch: its cases
    are refused before any work, recorded with the reason."""
    if variant.method is None:  # a stand-in, or refused already
        return None
    why = method_refusal(variant.method, info, backend=backend)
    if why:
        return f"{info.spec}: {why} (kvbench models inspect {info.spec})"
    why = describe.mlx_refusal(info.spec) if backend == "mlx" else None
    return f"{info.spec}: {why}" if why else None


def _first(override, default):
    return default if override is None else override


def _size(matrix: dict[str, list]) -> int:
    """How many combinations a matrix makes, without making them."""
    return math.prod(len(values) for values in matrix.values())


def _too_many(entries: list[Placed], sizes: list[int], what: str, issues: Issues) -> bool:
    """Whether the entries make more than MAX_CASES; if so, the issue is at the biggest one's
    matrix (or at the entry, for many small ones)."""
    total = sum(sizes)
    if total <= MAX_CASES:
        return False
    size, biggest = max(zip(sizes, entries), key=lambda pair: pair[0])
    where = biggest.at("matrix") if biggest.value.matrix else biggest.path
    issues.add(biggest.doc, where, f"the suite makes {total} {what}, more than the {MAX_CASES}"
               f" cases a suite may have", f"this entry makes {size}; split the suite or drop"
               " matrix values")
    return True
