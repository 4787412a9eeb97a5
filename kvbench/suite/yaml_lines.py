"""YAML loading that remembers the line of every key, so problems can name file:line."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvbench.suite.errors import Path, SuiteError, SuiteIssue, dotted

_MERGE_TAG = "tag:yaml.org,2002:merge"
# Keys and list items a suite may hold; aliases repeat what they name, so a small file could
# otherwise expand to billions ("billion laughs"). Real suites hold a few thousand.
MAX_VALUES = 100_000


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-3 and 2.5e3 as numbers (YAML 1.1 wants 1.0e-3)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass
class YamlDoc:
    file: str  # as shown to the user
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)  # key path -> 1-based line of the key

    def line(self, path: Path) -> int:
        """Line of `path`, else of its nearest written parent (a missing key -> its mapping)."""
        path = tuple(path)
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)


def load_yaml(text: str, file: str) -> YamlDoc:
    """Parse one YAML document; syntax errors and duplicate keys raise SuiteError."""
    last_line = max(1, len(text.splitlines()))  # "end of stream" is past it: name the last line
    try:
        loader = _Loader(text)  # checks every character at once: ReaderError here
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise SuiteError([SuiteIssue(file, line, "", f"YAML error: character"
                                     f" {chr(exc.character)!r} is not allowed")]) from None
    try:
        node = loader.get_single_node()
        doc = YamlDoc(file, None, {(): 1})
        problems: list[SuiteIssue] = []
        if node is not None:
            doc.data = _build(loader, node, (), doc, problems)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = min(mark.line + 1, last_line) if mark else 1
        raise SuiteError([SuiteIssue(file, line, "", f"YAML syntax error: {exc.problem}",
                                     exc.context or "")]) from None
    except RecursionError:
        raise SuiteError([SuiteIssue(file, 1, "", "YAML nested too deeply to read")]) from None
    finally:
        loader.dispose()
    if problems:
        raise SuiteError(problems)
    return doc


def _plain(key: Any) -> bool:
    return isinstance(key, (str, int, float, bool, type(None)))


def _build(loader: _Loader, node: yaml.Node, path: Path, doc: YamlDoc, problems) -> Any:
    if len(doc.lines) > MAX_VALUES:  # one line entry per key and list item built so far
        top = path[:1]  # the key that holds it: a line inside would be the anchor's
        raise SuiteError([SuiteIssue(doc.file, doc.line(top), dotted(top),
                                     f"the file holds more than {MAX_VALUES} keys and list items",
                                     "an alias (*name) repeats all that its anchor holds")])
    if isinstance(node, yaml.MappingNode):
        # PyYAML keeps the last of two equal keys silently; a user almost never means that.
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            if not _plain(key):
                problems.append(SuiteIssue(doc.file, line, dotted(path),
                                           f"a key must be a plain name, got {key!r}"))
            elif key in first:
                problems.append(SuiteIssue(doc.file, line, dotted(path + (key,)),
                                           f"duplicate key (first written at line {first[key]})"))
            else:
                first[key] = line
        loader.flatten_mapping(node)  # `<<: *anchor` merges; keys written here win
        out = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if _plain(key):
                doc.lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = _build(loader, value_node, path + (key,), doc, problems)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            doc.lines[path + (index,)] = item.start_mark.line + 1
            items.append(_build(loader, item, path + (index,), doc, problems))
        return items
    return loader.construct_object(node, deep=True)
