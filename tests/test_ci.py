"""CI runs the linters: a ruff or mypy finding fails `.ci/run` before the tests start."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _steps() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [line.strip() for line in lines if line.strip().startswith("make ")]


def test_ci_runs_lint_then_tests() -> None:
    assert _steps() == ["make lint", "make test"]
    assert "set -euo pipefail" in (ROOT / ".ci" / "run").read_text()  # a failed lint stops it


def test_lint_target_checks_every_python_tree_and_types_the_proxy() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target is not None
    recipe = target.group(1)
    assert re.search(r"ruff check proxy profiler tests benchmarks$", recipe, re.MULTILINE)
    assert re.search(r"mypy proxy$", recipe, re.MULTILINE)
