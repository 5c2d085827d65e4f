"""No import loop through the registry's importlib: finding the policies never imports
`routing` (which imports the registry), and the package's `__init__` imports nothing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_LOADED = """
import sys
from proxy.policies import registry
registry.policies()
print(" ".join(sorted(m for m in sys.modules if m.startswith("proxy.policies"))))
"""


def test_finding_the_policies_does_not_import_the_routing_machinery() -> None:
    done = subprocess.run([sys.executable, "-c", _LOADED], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    loaded = set(done.stdout.split())
    assert {"proxy.policies.pd", "proxy.policies.ppd", "proxy.policies.live"} <= loaded
    assert "proxy.policies.routing" not in loaded


def test_the_package_init_imports_nothing() -> None:
    tree = ast.parse((ROOT / "proxy" / "policies" / "__init__.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
