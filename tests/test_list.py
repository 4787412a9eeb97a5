"""`kvbench list`: whole-sentence descriptions, and one method's or benchmark's parameters (type,
default, range, meaning) and metrics, read from the code (kvbench.describe). No model is loaded."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from kvbench import describe
from kvbench.benchmarks import BENCHMARKS
from kvbench.methods import METHODS
from tests.plugins.cli_support import invoke, wide_consoles  # noqa: F401


def table_rows(output: str, title: str | None = None) -> list[list[str]]:
    """The cells of each row of the table under `title` (the first table when None); a cell
    that rich wrapped onto more lines is joined back into one."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if title is None or title in line)
    body = next(i for i in range(start, len(lines)) if lines[i].startswith("┡"))
    rows: list[list[str]] = []
    for line in lines[body + 1:]:
        if line.startswith("└"):
            break
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if cells[0] or not rows:
            rows.append(cells)
        else:  # a wrapped row goes on: its cells continue the previous line's
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return rows


def first_paragraph(cls: type) -> str:
    return " ".join(describe.docstring(cls).split("\n\n")[0].split())


# ---------------------------------------------------------------- descriptions


def test_first_sentence_joins_lines_and_passes_abbreviations_and_decimals():
    text = """KIVI (Liu et al. 2024): keeps 0.5 of the
    tokens, e.g. the newest, i.e. recent ones. The rest is dropped."""
    assert describe.first_sentence(text) == (
        "KIVI (Liu et al. 2024): keeps 0.5 of the tokens, e.g. the newest, i.e. recent ones.")
    # no full stop: the whole first paragraph, never the next one
    assert describe.first_sentence("One line\nand its end\n\nNext paragraph.") == (
        "One line and its end")


@pytest.mark.parametrize("what, registry, config", [
    ("methods", METHODS, lambda cls: cls),
    ("benchmarks", BENCHMARKS, lambda cls: cls.Params),
])
def test_list_describes_each_by_its_whole_first_sentence(what, registry, config):
    result = invoke("list", what)
    assert result.exit_code == 0, result.output
    rows = {row[0]: row for row in table_rows(result.output)}
    assert sorted(rows) == registry.names()
    for name, (_, params, description) in rows.items():
        cls = registry.get(name)
        assert description.endswith(".") or description == first_paragraph(cls), name
        assert not description.endswith(","), name
        assert first_paragraph(cls).startswith(description), name
        for field in dataclasses.fields(config(cls)):
            assert field.name in params, (name, field.name)


def test_list_benchmarks_no_longer_cuts_compaction_mid_sentence():
    rows = {row[0]: row[2] for row in table_rows(invoke("list", "benchmarks").output)}
    assert rows["compaction"].endswith("and whether it holds the expected fact.")


# ---------------------------------------------------------------- one method


def test_list_one_method_shows_its_docstring_and_every_field_with_its_default():
    result = invoke("list", "methods", "turbo3")
    assert result.exit_code == 0, result.output
    cls = METHODS.get("turbo3")
    assert describe.first_sentence(describe.docstring(cls)) in " ".join(result.output.split())
    rows = {row[0]: row for row in table_rows(result.output, "parameters of turbo3")}
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert list(rows) == [f.name for f in fields]
    for f in fields:
        _, _, default, _, _ = rows[f.name]
        assert default == repr(f.default), f.name
    # ranges from Turbo.__post_init__; meanings from the parent's docstring (a preset has none)
    assert rows["bits"][1:4] == ["int", "3", "2, 3 or 4"]
    assert rows["outlier_fraction"][3] == "in [0, 1)"
    assert rows["window"][3] == ">= 0"
    assert rows["rotation"][1] == "hadamard | haar"
    assert rows["outlier_channels"][1] == "tuple[int, ...] | None"
    assert "bits per coordinate" in rows["bits"][4]
    assert all(row[4] != describe.UNKNOWN for row in rows.values())


def test_token_methods_show_the_budget_they_inherit():
    rows = {row[0]: row for row in table_rows(invoke("list", "methods", "snapkv").output,
                                               "parameters of snapkv")}
    assert rows["ratio"][1:4] == ["float | None", "None", "between 0 and 1 (exclusive)"]
    assert rows["budget"][3] == "at least 1 token"
    assert rows["kernel"][3] == "an odd number >= 1"
    assert rows["pooling"][3] == "one of avg, max"


@dataclass
class Knob:
    """A knob.

    Parameters:
        level: int = 3 — how far it turns,
            in steps.
        mode: "a" | "b" = "a" — which way.
    """

    level: int = 3
    mode: Literal["a", "b"] = "a"
    note: str | None = None
    extra: list[int] = dataclasses.field(default_factory=lambda: [1, 2])

    def __post_init__(self):
        self._check_level()
        for name in ("level",):
            if getattr(self, name) == 0:
                raise ValueError(f"{name} must be nonzero, got {getattr(self, name)!r}")

    def _check_level(self):
        if not 1 <= self.level <= 9:
            raise ValueError(f"level must be in 1..9, got {self.level}")


def test_parameters_read_ranges_and_meanings_and_say_nothing_where_the_code_does_not():
    params = {p.name: p for p in describe.parameters(Knob)}
    assert params["level"] == describe.Param("level", "int", "3", "in 1..9; nonzero",
                                             "how far it turns, in steps.")
    assert params["mode"] == describe.Param("mode", "a | b", "'a'", "-", "which way.")
    assert params["note"] == describe.Param("note", "str | None", "None", "-", "-")
    assert params["extra"].default == "[1, 2]"


def test_ranges_come_through_helpers_and_super():
    # decay: check_width("base_bits", ...) and an f-string naming another field
    decay = describe.field_ranges(METHODS.get("decay"))
    assert decay["base_bits"] == "an int in 1..8"
    assert decay["evict_below"] == "in [0, min_below]"
    # am_task: super().__post_init__ -> Budget -> self.check_budget (overridden, then super)
    assert describe.field_ranges(METHODS.get("am_task"))["ratio"] == "between 0 and 1 (exclusive)"
    # perplexity: TextWindowParams' check_at_least(self, {...}) through super().__post_init__
    perplexity = describe.field_ranges(BENCHMARKS.get("perplexity").Params)
    assert perplexity["offset"] == ">= 0" and perplexity["continuation"] == ">= 2"


# ---------------------------------------------------------------- one benchmark


def test_list_one_benchmark_shows_every_parameter_and_every_metric():
    result = invoke("list", "benchmarks", "proofs")
    assert result.exit_code == 0, result.output
    cls = BENCHMARKS.get("proofs")
    params = {row[0]: row for row in table_rows(result.output, "parameters of proofs")}
    assert list(params) == [f.name for f in dataclasses.fields(cls.Params)]
    assert params["n_vectors"][2:4] == ["4096", ">= 1"]
    assert params["layers"][2] == "[0]"
    metrics = {row[0]: row for row in table_rows(result.output, "metrics of proofs")}
    assert list(metrics) == list(cls.metrics)
    for name, spec in cls.metrics.items():
        assert metrics[name][1:] == [spec.unit or "-", spec.direction, spec.timing or "no",
                                     spec.description], name
    assert metrics["encode_ms"][3] == "absolute" and metrics["mse"][3] == "no"


def test_every_metric_of_every_benchmark_has_a_definition():
    for name in BENCHMARKS.names():
        for metric, spec in BENCHMARKS.get(name).metrics.items():
            assert spec.description.strip(), f"{name}.{metric}"


# ---------------------------------------------------------------- errors and help


@pytest.mark.parametrize("what, typo, hint", [
    ("methods", "turbo33", "Did you mean 'turbo3'"),
    ("benchmarks", "perplexty", "Did you mean 'perplexity'"),
])
def test_unknown_name_exits_2_with_the_nearest_names(what, typo, hint):
    result = invoke("list", what, typo)
    assert result.exit_code == 2
    assert hint in result.output


def test_a_name_is_refused_for_models_and_suites():
    result = invoke("list", "models", "bundled:smollm2-135m")
    assert result.exit_code == 2 and "kvbench list methods NAME" in result.output


def test_help_says_what_one_name_shows():
    text = " ".join(invoke("list", "--help").output.split())
    assert "kvbench list methods NAME" in text and "allowed range" in text
