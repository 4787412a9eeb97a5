"""The package's shape, as ARCHITECTURE.md draws it: imports run one way, down its layers; no
circle, between modules or between packages; no private name imported from another module; no
module longer than 400 lines; at most 6 modules at the package's root.

Every import counts, those inside functions too (they run back up just the same). The layers
are read from the fenced block of ARCHITECTURE.md that follows "## Layers", so the picture and
the check cannot drift apart. `python -m tests.test_architecture` prints the graph's figures.
"""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvbench"
MAX_LINES = 400
MAX_ROOT_MODULES = 6


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of kvbench (a package is its __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def room(name: str, mods: dict[str, Path]) -> str:
    """Where a module stands: its package (a package's __init__ is the package), or itself for
    a module at the root (each of those is a part of its own)."""
    package = name.rpartition(".")[0]
    return name if mods[name].name == "__init__.py" or package == "kvbench" else package


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """(module -> the kvbench modules it imports, [(module, private name it imports)])."""
    def target(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    edges: dict[str, set[str]] = defaultdict(set)
    private = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [target(a.name) for a in node.names if a.name.startswith("kvbench")]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                if not base.startswith("kvbench"):
                    continue
                found = [target(f"{base}.{a.name}") for a in node.names]
                private += [(name, a.name) for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
            else:
                continue
            edges[name].update(t for t in found if t and t != name)
    return edges, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def layers() -> list[list[str]]:
    """The packages of each layer, top first, from ARCHITECTURE.md."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = re.search(r"## Layers.*?```\n(.*?)```", text, re.S).group(1)
    rows = [line.split("#")[0].split() for line in block.splitlines()]
    return [row for row in rows if row]


def layer_of(room_name: str, table: list[list[str]]) -> int:
    for i, row in enumerate(table):
        if room_name in row:
            return i
    raise AssertionError(f"package {room_name} is in no layer of ARCHITECTURE.md")


def upward(mods: dict[str, Path], edges: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    table = layers()
    found = []
    for source, targets in edges.items():
        own = layer_of(room(source, mods), table)
        for t in targets:
            if layer_of(room(t, mods), table) < own:
                found.append(f"{source} -> {t}")
    return sorted(found)


def room_graph(mods: dict[str, Path], edges: dict[str, set[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for t in targets:
            if room(source, mods) != room(t, mods):
                graph[room(source, mods)].add(room(t, mods))
    return graph


MODS = modules()
EDGES, PRIVATE = imports(MODS)


def test_every_package_has_a_layer_and_imports_run_down():
    assert upward(MODS, EDGES) == []


def test_no_circle_between_modules_or_packages():
    assert cycles(EDGES) == []
    assert cycles(room_graph(MODS, EDGES)) == []


def test_no_private_name_is_imported_from_another_module():
    assert PRIVATE == []


@pytest.mark.parametrize("name", sorted(MODS))
def test_modules_fit_in_one_sitting(name):
    lines = len(MODS[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODS[name]} has {lines} lines"


def test_the_package_root_holds_few_modules():
    root = [p.name for p in PACKAGE.glob("*.py") if p.name != "__main__.py"]  # an entry point
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)


def test_the_checks_catch_what_they_look_for():
    """The graph functions on a made-up graph: a circle and an import up are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    table = layers()
    top, bottom = table[0][0], table[-1][0]
    fake = {top: Path("x/__init__.py"), bottom: Path("y/__init__.py")}
    assert upward(fake, {bottom: {top}}) == [f"{bottom} -> {top}"]
    assert upward(fake, {top: {bottom}}) == []


if __name__ == "__main__":
    rooms = {room(m, MODS) for m in MODS}
    print(f"{len(MODS)} modules in {len(rooms)} packages on {len(layers())} layers;"
          f" {sum(map(len, EDGES.values()))} imports between modules")
    print(f"imports running up: {len(upward(MODS, EDGES))}; circles between modules:"
          f" {len(cycles(EDGES))}, between packages: {len(cycles(room_graph(MODS, EDGES)))};"
          f" private names imported: {len(PRIVATE)}")
    longest = max(MODS, key=lambda m: len(MODS[m].read_text().splitlines()))
    print(f"longest module: {longest} ({len(MODS[longest].read_text().splitlines())} lines);"
          f" modules at the root: {len(list(PACKAGE.glob('*.py')))}")
