"""A policy's name is written in its own module alone (issue 32): everything else - the proxy,
the profiler, the simulator's grids and the paper's tables, the benchmarks - takes it from the
module (`proxy.policies.pd.NAME`) or from the registry (`registry.label`,
`registry.fixed_label`), so renaming or adding a policy touches one file.

Route, role and reason values are spelt like some policies (`pd`, `local`, `replica`,
`readback`, `live`): code names those through their enums (`RouteKind.LOCAL`), whose
declarations are the one place those strings are allowed; docstrings are prose.
"""

from __future__ import annotations

import ast
from pathlib import Path

from proxy.policies import registry

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("proxy", "profiler", "benchmarks")
OWN = ROOT / "proxy" / "policies"
# (file, string): spelt like a policy label, meaning something else.
ALLOWED = {
    # The product's name, declared once (`PRODUCT`); the policy `ppd` is another word.
    ("proxy/shared/vocabulary.py", "ppd"),
    # The vLLM project's router binary, a peer the proxy benchmark runs; the policy of that
    # name follows its rule.
    *((f"benchmarks/proxy_overhead/{name}", "vllm-router")
      for name in ("__init__.py", "peers.py", "report.py")),
}
# The PPD paper's published figures, keyed by the paper's own names of its modes
# (`replica`, `x=0`, `x=1`) and of its routes, transcribed as printed.
ALLOWED_FILES = {"profiler/simulator/paper_figures.py"}


def _is_label(text: str) -> bool:
    if text in registry.names():
        return True
    try:
        registry.parse_label(text, lambda: Path("table.csv"))
    except ValueError:
        return False
    return text == text.strip()


def _prose_and_enum_values(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings, or an Enum member's value."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skipped.add(id(body[0].value))
        if isinstance(node, ast.ClassDef) and any(
                getattr(base, "id", getattr(base, "attr", "")).endswith("Enum")
                for base in node.bases):
            for statement in node.body:
                if isinstance(statement, ast.Assign) and isinstance(statement.value,
                                                                    ast.Constant):
                    skipped.add(id(statement.value))
    return skipped


def policy_labels_outside_their_modules() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.is_relative_to(OWN):
                continue
            name = path.relative_to(ROOT).as_posix()
            if name in ALLOWED_FILES:
                continue
            tree = ast.parse(path.read_text(), filename=name)
            skipped = _prose_and_enum_values(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and id(node) not in skipped and (name, node.value) not in ALLOWED
                        and _is_label(node.value)):
                    found.append(f"{name}:{node.lineno}: {node.value!r}")
    return found


def test_policy_names_are_written_only_in_their_own_modules() -> None:
    found = policy_labels_outside_their_modules()
    assert not found, ("policy names or labels written outside proxy/policies/ (take them "
                       "from the policy module's NAME or from proxy.policies.registry; a "
                       "route, role or reason from its enum):\n" + "\n".join(found))


def test_the_scan_finds_a_policy_name_written_as_data(tmp_path: Path) -> None:
    # The check itself: a label as data is found, the same text as a docstring or an enum
    # member's value is not.
    source = ('"""pd and local."""\nimport enum\n\nclass R(enum.StrEnum):\n    PD = "pd"\n\n'
              'POLICIES = ("pd", "x=0.5", "ppd-wtpot3", "not-a-policy")\n')
    tree = ast.parse(source)
    skipped = _prose_and_enum_values(tree)
    flagged = [node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and id(node) not in skipped and _is_label(node.value)]
    assert flagged == ["pd", "x=0.5", "ppd-wtpot3"]


def test_registry_labels_round_trip() -> None:
    assert [registry.fixed_label(x) for x in (0.0, 0.5, 1.0)] == ["pd", "x=0.5", "local"]
    assert [registry.local_share(label) for label in ("pd", "x=0.33", "local", "ppd")] == [
        0.0, 0.33, 1.0, None]
    for name, flags in (("ppd", {"w_tpot": 3.0}), ("threshold", {"non_cached_tokens": 256}),
                        ("fixed", {"x": 0.25})):
        label = registry.label(name, **flags)
        parsed_name, parsed = registry.parse_label(label, lambda: Path("t.csv"))
        assert parsed_name == name
        assert {k: v for k, v in parsed.items() if k in flags} == flags
