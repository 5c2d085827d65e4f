"""The import graph has no circles: not between modules (function-local imports included),
and not between the rooms of the tree - a sub-package (`profiler/engine/`,
`proxy/policies/`) counted as one, a top-level module as itself - so no import runs back up
from a lower layer to one that imports it (docs/architecture.md, "Components")."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("proxy", "profiler", "benchmarks")


def _module_file(dotted: str) -> Path | None:
    """The file a dotted module name is (a package's `__init__.py`), or None: not ours."""
    path = ROOT.joinpath(*dotted.split("."))
    if path.is_dir() and (path / "__init__.py").is_file():
        return path / "__init__.py"
    file = path.with_suffix(".py")
    return file if file.is_file() else None


def _imports(file: Path) -> Iterable[Path]:
    """Every module of the repository a file imports, wherever the import statement is."""
    package = ".".join(file.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from a import b`: the module a.b when there is one, else a itself.
            targets = [f"{base}.{alias.name}" if _module_file(f"{base}.{alias.name}")
                       else base for alias in node.names]
        else:
            continue
        for target in targets:
            found = _module_file(target)
            if found is not None and found != file:
                yield found


def _graph() -> dict[Path, set[Path]]:
    files = [path for tree in TREES for path in (ROOT / tree).rglob("*.py")
             if "__pycache__" not in path.parts]
    return {file: set(_imports(file)) for file in files}


def _room(file: Path) -> str:
    """A module's room: its sub-package under a top folder, else the module itself."""
    parts = file.relative_to(ROOT).parts
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else "/".join(parts)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = {str(k.relative_to(ROOT)): {str(v.relative_to(ROOT)) for v in vs}
             for k, vs in _graph().items()}
    assert _circles(graph) == []


def test_no_import_runs_back_up_between_rooms() -> None:
    rooms: dict[str, set[str]] = {}
    for file, imported in _graph().items():
        # A package's __init__ only hands names on: its arrows are its modules'.
        if file.name == "__init__.py":
            continue
        rooms.setdefault(_room(file), set()).update(
            _room(other) for other in imported
            if other.name != "__init__.py" or other.parent.parent != ROOT)
    for room, imported in rooms.items():
        imported.discard(room)
    assert _circles(rooms) == []


def test_the_checks_see_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
