"""docs/architecture.md cannot drift from the tree: its module map lists every module of
proxy/ and profiler/ (a policy module may go without: the registry lists policies) and
nothing else, and every module (and the name after it) the page names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("proxy", "profiler")
_MAP_ENTRY = re.compile(r"^- `(?P<path>(?:proxy|profiler)/[\w/.-]+\.py)`: ", re.M)
_DOTTED = re.compile(r"`(?P<name>(?:proxy|profiler)(?:\.\w+)+)")
_PATH = re.compile(r"`(?P<path>(?:proxy|profiler)/[\w/]*\w(?:\.py|/))`")
_FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)


def _text() -> str:
    """The page without its code blocks (the example policy names a file yet to be written)."""
    return _FENCE.sub("", DOC.read_text())


def _modules() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for package in PACKAGES
            for path in (ROOT / package).rglob("*.py")
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def _defined(tree: ast.Module | ast.ClassDef) -> dict[str, ast.AST]:
    """The names a module or class body defines or imports, by name."""
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING: ... else: ...`
            for branch in (node.body, node.orelse):
                names.update(_defined(ast.Module(body=branch, type_ignores=[])))
    return names


def _missing(name: str) -> str | None:
    """Why a dotted name does not resolve (None: it does): the longest module prefix, then
    a name defined in it, then (for a class) a name defined in the class."""
    parts = name.split(".")
    path = ROOT / parts[0]
    rest = parts[1:]
    while rest and ((path / rest[0]).is_dir() or (path / f"{rest[0]}.py").is_file()):
        path = path / rest[0] if (path / rest[0]).is_dir() else path / f"{rest[0]}.py"
        rest = rest[1:]
    if not rest:
        return None
    source = path / "__init__.py" if path.is_dir() else path
    scope: ast.Module | ast.ClassDef = ast.parse(source.read_text())
    for part in rest[:2]:
        node = _defined(scope).get(part)
        if node is None:
            return f"{part!r} is not defined in {source.relative_to(ROOT)}"
        if not isinstance(node, ast.ClassDef):
            return None
        scope = node
    return None


def _policy_modules() -> set[str]:
    """The policy modules (those of proxy/policies/ that set NAME): the registry finds them,
    so adding a policy is one module and its tests - no line here is needed."""
    return {path.relative_to(ROOT).as_posix()
            for path in (ROOT / "proxy" / "policies").glob("*.py")
            if any(isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "NAME" for t in node.targets)
                   for node in ast.parse(path.read_text()).body)}


def test_the_module_map_lists_every_module_and_only_those() -> None:
    listed = _MAP_ENTRY.findall(DOC.read_text())
    assert len(listed) == len(set(listed)), "a module is listed twice"
    modules = _modules()
    absent = sorted(modules - set(listed) - _policy_modules())
    assert not absent, ("docs/architecture.md's module map lacks (add a line each, "
                        "'- `PATH`: what it does'): " + ", ".join(absent))
    assert not sorted(set(listed) - modules), "the module map lists modules that do not exist"


def test_every_module_the_page_names_exists() -> None:
    text = _text()
    paths = {match["path"] for match in _PATH.finditer(text)}
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"
    wrong = {name: why for name in {m["name"] for m in _DOTTED.finditer(text)}
             if (why := _missing(name)) is not None}
    assert not wrong, f"docs/architecture.md names what does not exist: {wrong}"


def test_a_policy_module_needs_no_line_but_other_modules_do() -> None:
    policies = _policy_modules()
    assert "proxy/policies/pd.py" in policies and "proxy/policies/live.py" in policies
    assert not {"proxy/policies/base.py", "proxy/policies/registry.py",
                "proxy/policies/routing.py"} & policies
