"""`kvbench list`: whole-sentence descriptions, and one method's or benchmark's parameters (type,
default, range, meaning) and metrics, read from the code: ranges and meanings from each field's
declaration (kvbench.config.fields.param, shown by kvbench.config.describe). No model is
loaded."""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Literal

import pytest

from kvbench.benchmarks import BENCHMARKS
from kvbench.cli import common as consoles
from kvbench.config import describe
from kvbench.config.fields import Settings, declaration, one_of, param, span
from kvbench.methods import METHODS
from tests.plugins.cli_support import invoke, wide_consoles  # noqa: F401

# Every built-in settings class a suite sets: (what, name, the dataclass of its parameters)
BUILT_IN = ([("methods", name, METHODS.get(name)) for name in METHODS.names()]
            + [("benchmarks", name, BENCHMARKS.get(name).Params) for name in BENCHMARKS.names()])


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


def declared_range(config: type, field: dataclasses.Field) -> str:
    """What `kvbench list` must show as a field's range: its declared Range (and rule) as text,
    else a Literal's choices, else nothing."""
    text = declaration(field).range_text() if declaration(field) else ""
    tp = typing.get_type_hints(config)[field.name]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # an optional Literal too
        tp = next((a for a in typing.get_args(tp) if typing.get_origin(a) is Literal), tp)
    if not text and typing.get_origin(tp) is Literal:
        text = str(one_of(*typing.get_args(tp)))
    return text or describe.UNKNOWN


# ---------------------------------------------------------------- descriptions


def test_first_sentence_joins_lines_and_passes_abbreviations_and_decimals():
    text = """KIVI (Liu et al. 2024): keeps 0.5 of the
    tokens, e.g. the newest, i.e. recent ones. The rest is dropped."""
    assert describe.first_sentence(text) == (
        "KIVI (Liu et al. 2024): keeps 0.5 of the tokens, e.g. the newest, i.e. recent ones.")
    # no full stop: the whole first paragraph, never the next one
    assert describe.first_sentence("One line\nand its end\n\nNext paragraph.") == (
        "One line and its end")


def test_a_docstring_is_unwrapped_for_the_terminal_to_wrap_but_lists_keep_their_lines():
    text = """First line
    goes on here.

    - an item
    - another
      continued
    Then prose again
    joined."""
    assert describe.unwrapped(text) == (
        "First line goes on here.\n\n- an item\n- another\n  continued Then prose again joined.")


def test_a_shown_method_reads_as_whole_paragraphs_at_80_columns():
    """At 80 columns rich wrapped each hard-wrapped docstring line again: ragged lines."""
    console = consoles.console
    saved = console._width
    console.width = 80
    try:
        result = invoke("list", "benchmarks", "ruler")
    finally:
        console._width = saved
    lines = result.output.splitlines()
    paragraph = lines[lines.index("") + 1: lines.index("", lines.index("") + 1)]
    # each line but the paragraph's last is filled to near the width
    assert all(len(line) > 70 for line in paragraph[:-1]), paragraph
    assert "qa_1/qa_2 with a local SQuAD" in " ".join(line.strip() for line in paragraph)


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
        _, _, default, allowed, meaning = rows[f.name]
        assert default == repr(f.default), f.name
        assert allowed == declared_range(cls, f), f.name
        assert meaning == declaration(f).meaning, f.name
    # ranges and meanings from the fields' declarations, the preset's inherited from Turbo's
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
    # the declared Range's text (kvbench.config.fields), and a rule check() enforces after it
    assert rows["ratio"][1:4] == ["float | None", "None", "in (0, 1)"]
    assert rows["budget"][3] == ">= 1"
    assert rows["kernel"][3] == ">= 1; odd"
    assert rows["pooling"][3] == "avg or max"
    from kvbench.methods.settings.tokens import TokenMethod

    inherited = {f.name: f for f in dataclasses.fields(TokenMethod)}
    for name in ("ratio", "budget"):
        assert rows[name][3] == declared_range(TokenMethod, inherited[name])
        assert rows[name][4] == declaration(inherited[name]).meaning


@dataclass
class Knob(Settings):
    """A knob."""

    level: int = param(3, range=span(1, 9), rule="nonzero",  # the rule: what check() enforces
                       meaning="how far it turns,\n        in steps.")  # shown on one line
    mode: Literal["a", "b"] = param("a", meaning="which way.")
    note: str | None = None
    extra: list[int] = dataclasses.field(default_factory=lambda: [1, 2])


def test_parameters_read_ranges_and_meanings_and_say_nothing_where_the_code_does_not():
    params = {p.name: p for p in describe.parameters(Knob)}
    assert params["level"] == describe.Param("level", "int", "3", "in 1..9; nonzero",
                                             "how far it turns, in steps.")
    # a Literal's choices are its range
    assert params["mode"] == describe.Param("mode", "a | b", "'a'", "a or b", "which way.")
    assert params["note"] == describe.Param("note", "str | None", "None", "-", "-")
    assert params["extra"].default == "[1, 2]"


@dataclass
class Unresolved(Settings):
    """A plug-in's settings whose annotation names a type imported only for type checkers."""

    level: int = param(3, range=span(1, 9), meaning="how far it turns")
    shape: "NotImportedHere" = None  # noqa: F821


def test_settings_with_an_unresolvable_annotation_still_build_and_check_their_ranges():
    assert Unresolved(level=9).level == 9
    with pytest.raises(ValueError, match=r"level must be in 1\.\.9, got 10"):
        Unresolved(level=10)
    assert {p.name: p.range for p in describe.parameters(Unresolved)}["level"] == "in 1..9"


def test_ranges_come_from_declarations_and_the_ones_inherited():
    def ranges(config: type) -> dict[str, str]:
        return {p.name: p.range for p in describe.parameters(config)}

    # decay: a declared span, and a rule naming another field (checked in check())
    decay = ranges(METHODS.get("decay"))
    assert decay["base_bits"] == "in 1..8"
    assert decay["evict_below"] == ">= 0; <= min_below"
    # am_task: ratio declared on TokenMethod, which it inherits
    assert ranges(METHODS.get("am_task"))["ratio"] == "in (0, 1)"
    # perplexity: offset declared on TextWindowParams, which its Params inherit
    perplexity = ranges(BENCHMARKS.get("perplexity").Params)
    assert perplexity["offset"] == ">= 0" and perplexity["continuation"] == ">= 2"


@pytest.mark.parametrize("what, name, config", BUILT_IN, ids=lambda x: x if isinstance(x, str)
                         else None)
def test_every_built_in_parameter_has_a_meaning_and_shows_its_declared_range(what, name, config):
    fields = [f for f in dataclasses.fields(config) if f.init]
    for f in fields:
        assert declaration(f) is not None and declaration(f).meaning.strip(), f"{name}.{f.name}"
    shown = {p.name: p for p in describe.parameters(config)}
    for f in fields:
        assert shown[f.name].range == declared_range(config, f), f"{name}.{f.name}"
        assert shown[f.name].meaning == declaration(f).meaning, f"{name}.{f.name}"
    # and `kvbench list` shows what describe reads
    result = invoke("list", what, name)
    assert result.exit_code == 0, result.output
    rows = {row[0]: row for row in table_rows(result.output, f"parameters of {name}")}
    assert list(rows) == [f.name for f in fields]
    for f in fields:
        assert rows[f.name][3:] == [shown[f.name].range, shown[f.name].meaning], f"{name}.{f.name}"


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
