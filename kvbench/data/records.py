"""A user's samples for the dataset benchmark: the rows of a local JSONL, JSON, CSV or Parquet
file, or of a dataset on the Hugging Face Hub ("hf:<dataset>[@<revision>][:<config>]:<split>",
downloaded on first use), read through the `datasets` library; and the fields a suite maps to each
sample's context, question, reference answers and classes (LongBench's context, input, answers
and all_classes by default).

A reference answer is a string or a list of them (a CSV cell holds one); numbers are read as
their text. Classes are a list of strings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.data.hf_datasets import datasets_module, load_hub_rows

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
HF = "hf:"


class RecordsError(ValueError):
    """Data that cannot be read as the suite asks; `role` is the mapped field at fault
    ("context", "question", "answers", "classes"), "samples" for too few rows, None for the
    data as a whole."""

    def __init__(self, message: str, role: str | None = None):
        super().__init__(message)
        self.role = role


@dataclass(frozen=True)
class Fields:
    """The data's field for each part of a sample; None: the part is not read."""

    context: str
    question: str | None
    answers: str
    classes: str | None

    def roles(self) -> dict[str, str]:
        return {role: name for role, name in (("context", self.context),
                                              ("question", self.question),
                                              ("answers", self.answers),
                                              ("classes", self.classes)) if name is not None}


@dataclass(frozen=True)
class Record:
    row: int  # its row in the data, from 0
    context: str
    question: str  # "" when the template asks none
    answers: tuple[str, ...]
    classes: tuple[str, ...]  # () when the metric reads none


def is_hf(source: str) -> bool:
    return source.startswith(HF)


def parse_hf_dataset(source: str) -> tuple[str, str | None, str]:
    """"hf:<dataset>[@<revision>][:<config>]:<split>" -> (dataset[@revision], config, split)."""
    parts = source.removeprefix(HF).split(":")
    if len(parts) == 2 and all(parts):
        return parts[0], None, parts[1]
    if len(parts) == 3 and all(parts):
        return parts[0], parts[1], parts[2]
    raise RecordsError(f"data {source!r}: expected a file or hf:<dataset>[:<config>]:<split>")


def check_source(source: str) -> None:
    """A local file that exists in a format read here, or a well-formed hf: source; nothing is
    read."""
    if is_hf(source):
        parse_hf_dataset(source)
        return
    path = Path(source)
    if path.suffix.lower() not in FORMATS:
        raise RecordsError(f"data file {source!r}: {path.suffix or 'no suffix'!r} is not a"
                           f" format read here; expected {', '.join(FORMATS)}")
    if not path.is_file():
        raise RecordsError(f"data file {source!r} does not exist")


def load_rows(source: str) -> Any:
    """The rows as a datasets.Dataset (one split)."""
    check_source(source)
    if is_hf(source):
        return load_hub_rows(f"data {source!r}", *parse_hf_dataset(source), error=RecordsError)
    datasets = datasets_module(f"data {source!r}", RecordsError)
    try:
        return datasets.load_dataset(FORMATS[Path(source).suffix.lower()],
                                     data_files=str(source), split="train")
    except Exception as exc:  # datasets raises many kinds for a file it cannot read
        raise RecordsError(f"data {source!r} could not be read: {exc}") from exc


def read_records(source: str, fields: Fields, samples: int | None = None) -> list[Record]:
    """The first `samples` rows (all of them: None) as records; RecordsError names the data, the
    field and the row of the first that cannot be read as mapped."""
    rows = load_rows(source)
    for role, name in fields.roles().items():
        if name not in rows.column_names:
            raise RecordsError(f"data {source!r} has no field {name!r} (the {role}); its"
                               f" fields: {', '.join(rows.column_names)}", role)
    if samples is not None and samples > len(rows):
        raise RecordsError(f"samples {samples} is above the {len(rows)} rows of data"
                           f" {source!r}", "samples")
    count = len(rows) if samples is None else samples
    return [_record(source, fields, row, rows[row]) for row in range(count)]


def _record(source: str, fields: Fields, row: int, values: dict[str, Any]) -> Record:
    def value(role: str) -> Any:
        found = values[fields.roles()[role]]
        if found is None:
            raise RecordsError(f"data {source!r}, row {row}: no value for field"
                               f" {fields.roles()[role]!r} (the {role})", role)
        return found

    def text(role: str, found: Any) -> str:
        if isinstance(found, bool) or not isinstance(found, (str, int, float)):
            raise RecordsError(f"data {source!r}, row {row}: field {fields.roles()[role]!r} (the"
                               f" {role}) holds {type(found).__name__} {found!r}, not text",
                               role)
        return str(found)

    def texts(role: str) -> tuple[str, ...]:
        found = value(role)
        if role == "classes" and not isinstance(found, list):
            raise RecordsError(f"data {source!r}, row {row}: field {fields.roles()[role]!r} (the"
                               f" classes) holds {found!r}, not a list", role)
        items = found if isinstance(found, list) else [found]
        if not items:
            raise RecordsError(f"data {source!r}, row {row}: field {fields.roles()[role]!r} (the"
                               f" {role}) is an empty list", role)
        return tuple(text(role, item) for item in items)

    return Record(
        row=row,
        context=text("context", value("context")),
        question=text("question", value("question")) if fields.question is not None else "",
        answers=texts("answers"),
        classes=texts("classes") if fields.classes is not None else (),
    )
