"""Checks of the names in a suite: registry names, and what its claims and gate tolerances name."""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

from kvbench.benchmarks import BENCHMARKS
from kvbench.benchmarks.specs.base import known_metrics
from kvbench.config.registry import Registry, UnknownName, did_you_mean
from kvbench.judge.claims import Claim, parse_claim
from kvbench.models.info import resolve_spec
from kvbench.suite.errors import Issues, Placed
from kvbench.suite.models import model_spec
from kvbench.suite.schema import BenchmarkEntry, ScopedClaim
from kvbench.suite.yaml_lines import YamlDoc


def check_gate_metrics(names: list[Placed[str]], benchmarks: list[Placed[BenchmarkEntry]],
                       issues: Issues) -> None:
    """A gate tolerance must name a metric some benchmark of the suite reports."""
    declared = [_declared(BENCHMARKS, b.value.kind) for b in benchmarks]
    if None in declared or not declared:
        return  # an unknown benchmark, or none: reported already; the metrics cannot be known
    known = set().union(*declared)
    for name in names:
        if name.value not in known:
            hint = did_you_mean(name.value, known).strip() or f"metrics: {', '.join(sorted(known))}"
            issues.add(name.doc, name.path,
                       f"no benchmark of this suite reports metric {name.value!r}", hint)


def _declared(registry: Registry, kind: str) -> set[str] | None:
    """The metrics a benchmark kind reports; None for an unknown kind (or one that cannot be
    imported, reported by lookup)."""
    try:
        return set(known_metrics(registry.get(kind)))
    except Exception:  # a module:Class path can fail in any way
        return None


def lookup(registry: Registry, name: str, doc: YamlDoc, path: tuple, issues: Issues):
    """The class `name` stands for, or None with the issue added."""
    try:
        cls = registry.get(name)
    except UnknownName as exc:
        message, _, hint = str(exc).partition(". ")
        issues.add(doc, path, message, hint or f"see `kvbench list {registry.kind}s`")
        return None
    except Exception as exc:  # importing a module:Class path runs its code: anything can fail
        if ":" not in name:
            raise
        issues.add(doc, path, f"cannot import {registry.kind} {name!r}: {type(exc).__name__}:"
                              f" {exc}")
        return None
    if registry.kind == "method":
        shape, ok = "a dataclass", _is_dataclass(cls)
    else:
        shape = "a class with a dataclass Params and a metrics table"
        ok = _is_dataclass(getattr(cls, "Params", None)) and isinstance(
            getattr(cls, "metrics", None), dict)
    if not ok:
        issues.add(doc, path, f"{name!r} is not a {registry.kind}: it must be {shape}")
        return None
    return cls


def _is_dataclass(cls: Any) -> bool:
    return isinstance(cls, type) and dataclasses.is_dataclass(cls)


def parse(text: str, doc: YamlDoc, path: tuple, issues: Issues) -> Placed[Claim] | None:
    try:
        return Placed(parse_claim(text, source=f"{doc.file}:{doc.line(path)}"), doc, path)
    except ValueError as exc:
        issues.add(doc, path, str(exc))
        return None


def bench_claims(bench: Placed[BenchmarkEntry], cls, issues: Issues):
    """(claim, case glob or None, index) for each parsable claim of a benchmark entry."""
    out = []
    for i, item in enumerate(bench.value.claims):
        scoped = isinstance(item, ScopedClaim)
        path = bench.at("claims", i, "claim") if scoped else bench.at("claims", i)
        claim = parse(item.claim if scoped else item, bench.doc, path, issues)
        if claim is None:
            continue
        if scoped and (item.goal or item.model):
            model = item.model and calibrated_on(Placed(item.model, bench.doc,
                                                        bench.at("claims", i, "model")), issues)
            claim = Placed(dataclasses.replace(claim.value, goal=item.goal, model=model),
                           claim.doc, claim.path)
        if cls is not None:
            who = f"benchmark {bench.value.kind!r} does not report"
            check_metric(claim, set(known_metrics(cls)), who, issues)
        out.append((claim, item.cases if scoped else None, i))
    return out


def calibrated_on(model: Placed[str], issues: Issues) -> str:
    """A claim's `model:` as a case's model is written (a checkpoint path made absolute against
    the suite); a bundled or tiny model kvbench does not know is an issue (a misspelt one would
    skip its claim everywhere). A hub id is not looked up: the claim's model is not run."""
    if model.value.startswith(("bundled:", "tiny:")):
        try:
            resolve_spec(model.value)
        except ValueError as exc:
            issues.add(model.doc, model.path, str(exc))
    return model_spec(model)


def check_metric(claim: Placed[Claim], metrics: set[str], who: str, issues: Issues) -> None:
    """`who` says who lacks it: "benchmark 'proofs' does not report" (metric X)."""
    name = claim.value.metric
    if name not in metrics:
        hint = did_you_mean(name, metrics).strip() or f"known: {', '.join(sorted(metrics))}"
        issues.add(claim.doc, claim.path, f"{who} metric {name!r}", hint)


def check_reference(claim: Placed[Claim], labels: list[str], kind: str, issues: Issues) -> None:
    """A claim against another case names a method this benchmark runs."""
    reference = claim.value.reference
    if reference is not None and reference not in labels:
        hint = did_you_mean(reference, labels).strip() or f"it runs: {', '.join(labels)}"
        issues.add(claim.doc, claim.path, f"claim {claim.value.text!r} compares with method"
                   f" {reference!r}, which benchmark {kind!r} does not run", hint)


def check_scopes(bench: Placed[BenchmarkEntry], claims, ids: list[str], issues: Issues,
                 changed: bool = False) -> None:
    """A claim's `cases:` glob matches some case of its benchmark; `changed`: the command line
    changed the entry's parameters (--set), and a scope may match none of the cases it makes now
    (`ruler/x/length=1024` under --set ruler.length=32768): it then applies to none."""
    if changed:
        return
    for _, pattern, i in claims:
        if pattern is not None and not any(fnmatch.fnmatchcase(c, pattern) for c in ids):
            hint = did_you_mean(pattern, ids).strip() or (
                f"case ids look like {ids[0]!r}" if ids else "this benchmark has no cases")
            issues.add(bench.doc, bench.at("claims", i, "cases"),
                       f"{pattern!r} matches no case of this benchmark", hint)


def check_unseen_policy(kind: str, cls: type, variant: Any, case_id: str, claims,
                        issues: Issues) -> None:
    """A claim on a case of a benchmark that measures the codecs alone (its `codecs_only`: proofs)
    whose method's cache does more than its codecs: refused, the figure is the bare codec's.
    `variant`: a method variant of kvbench.suite.expand."""
    if not cls.codecs_only or variant.method is None:  # None: refused, it does not run
        return
    unseen = variant.method.policy_beyond_codec()
    if not unseen:
        return
    applied = [c for c in variant.claims if c.value.metric in known_metrics(cls)]
    applied += [c for c, pattern, _ in claims
                if pattern is None or fnmatch.fnmatchcase(case_id, pattern)]
    for claim in applied:
        issues.add(claim.doc, claim.path,
                   f"claim {claim.value.text!r} is on method {variant.label!r}, whose cache does"
                   f" more than its codecs ({'; '.join(unseen)}), and benchmark {kind!r}"
                   " measures the codecs alone",
                   "its figure would be the bare codec's: claim it in a benchmark that runs the"
                   " cache (perplexity, niah, quality), or leave the method out of the claim's"
                   " cases")
