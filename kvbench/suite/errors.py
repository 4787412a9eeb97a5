"""Suite problems, each with the file, line and key it is about, collected before anything runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Path = tuple[Any, ...]  # a key path into the YAML data: ("methods", 1, "params", "bits")
T = TypeVar("T")


def dotted(path: Path) -> str:
    """("methods", 1, "params", "bitz") -> "methods[1].params.bitz"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class SuiteIssue:
    file: str
    line: int
    key: str  # dotted path; "" for the file as a whole
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " + (f"{self.key}: " if self.key else "")
        return where + self.message + (f" ({self.hint})" if self.hint else "")


class SuiteError(Exception):
    """The suite is invalid; `issues` lists every problem found, one line each in str()."""

    def __init__(self, issues: list[SuiteIssue]):
        self.issues = issues
        super().__init__("\n".join(map(str, issues)))


class Issues:
    """Collects issues (once each, in the order found) so that every problem is reported."""

    def __init__(self):
        self.found: list[SuiteIssue] = []

    def add(self, doc, path: Path, message: str, hint: str = "") -> None:
        """`doc` is the YamlDoc the key was written in; its line map gives the line."""
        issue = SuiteIssue(doc.file, doc.line(path), dotted(path), message.rstrip("."), hint)
        if issue not in self.found:
            self.found.append(issue)

    def extend(self, issues: list[SuiteIssue]) -> None:
        self.found.extend(i for i in issues if i not in self.found)

    def raise_if_any(self) -> None:
        """Raise SuiteError with the issues in reading order: by file (as first met), then line."""
        if self.found:
            files = list(dict.fromkeys(i.file for i in self.found))
            raise SuiteError(sorted(self.found, key=lambda i: (files.index(i.file), i.line)))


@dataclass
class Placed(Generic[T]):
    """A value and where it was written: the file's YamlDoc and the key path in it."""

    value: T
    doc: Any  # the YamlDoc it was written in (kvbench.suite.yaml_lines)
    path: tuple

    def at(self, *more) -> tuple:
        return self.path + more

    def where(self) -> str:
        return f"{dotted(self.path)} ({self.doc.file}:{self.doc.line(self.path)})"
