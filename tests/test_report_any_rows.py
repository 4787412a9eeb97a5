"""Every benchmark's part of the report (report.md with its figures, and the results page)
renders for any number of cases: none, one, one that failed, and a few, whatever their metrics
hold (NaN included). Before, the stress section crashed on one level per method."""
from __future__ import annotations

import dataclasses
import math

import pytest

from kvbench.benchmarks.specs.base import BENCHMARKS
from kvbench.report.html import build_site
from kvbench.report.markdown import render_markdown, write_reports
from kvbench.results import CaseError, CaseResult, Metric
from tests.test_report_retrieval import run

KINDS = sorted(BENCHMARKS.names())


def _params(kind: str) -> dict:
    """The benchmark's parameters at their defaults ("x" for those without one)."""
    params = {}
    for field in dataclasses.fields(BENCHMARKS.get(kind).Params):
        if field.default is not dataclasses.MISSING:
            params[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            params[field.name] = field.default_factory()
        else:
            params[field.name] = "x"
    return params


def _case(kind: str, label: str, value: float, status: str = "ok", **params) -> CaseResult:
    specs = BENCHMARKS.get(kind).metrics
    metrics = {} if status != "ok" else {
        name: Metric(value=value, unit=spec.unit, direction=spec.direction, timing=spec.timing)
        for name, spec in specs.items()}
    return CaseResult(id=f"{kind}/{label}/{value}", benchmark=kind,
                      bench_params={**_params(kind), **params}, method=label.split("-")[0],
                      method_label=label, method_params={}, model="tiny:llama", status=status,
                      metrics=metrics, info={},
                      error=None if status == "ok" else CaseError(type="RuntimeError",
                                                                   message="boom", traceback=""))


def _render(result, tmp_path) -> str:
    pytest.importorskip("matplotlib")
    text = render_markdown(result)
    write_reports(result, tmp_path / "md")
    build_site([("run", result)], tmp_path / "site")
    return text


@pytest.mark.parametrize("kind", KINDS)
def test_no_case_of_a_benchmark_leaves_its_section_out(kind, tmp_path):
    other = next(k for k in KINDS if k != kind)
    text = _render(run([_case(other, "identity", 1.0)]), tmp_path)
    assert f"## {kind}\n" not in text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["one", "one failed", "one NaN", "several"])
def test_a_section_renders_for_any_number_of_cases(kind, shape, tmp_path):
    cases = {
        "one": [_case(kind, "identity", 1.0)],
        "one failed": [_case(kind, "identity", 1.0, status="error")],
        "one NaN": [_case(kind, "identity", math.nan)],
        "several": [_case(kind, label, value) for label, value in
                    (("identity", 1.0), ("intq-4bit", 0.5), ("snapkv-0.5", 0.25))],
    }[shape]
    text = _render(run(cases), tmp_path)
    assert f"## {kind}" in text
    assert (tmp_path / "md" / "report.md").read_text().startswith("# kvbench")
    assert (tmp_path / "site" / "index.html").exists()
