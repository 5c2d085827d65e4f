"""The shared policy layer names no policy: `proxy.policies.base`, `routing`, `registry` and
`proxy.config.settings` import no policy module and read no policy's flags; what a policy needs
loaded (ppd's verdicts at its weights, the files its flags name) and `--policy`'s default
come from the modules' own declarations, through the registry."""

from __future__ import annotations

import ast
from pathlib import Path

from proxy.config.policy_config import PolicyConfig
from proxy.policies import registry

ROOT = Path(__file__).resolve().parents[3]
SHARED = ("proxy/policies/base.py", "proxy/policies/routing.py", "proxy/policies/registry.py",
          "proxy/config/settings.py")


def _policy_modules() -> set[str]:
    return {f"proxy.policies.{Path(spec.decide.__code__.co_filename).stem}"
            for spec in registry.policies().values()}


def test_no_shared_module_imports_a_policy_module() -> None:
    policies = _policy_modules()
    for path in SHARED:
        tree = ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                named = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                named = {alias.name for alias in node.names}
            else:
                continue
            assert not named & policies, f"{path} imports {sorted(named & policies)}"


def test_the_shared_layer_reads_no_policys_flags() -> None:
    """Not `config.table`, `self.policy.live_costs`...: the declaring module's hook says
    (`registry.table_path`, `registry.costs_path`, ppd's `inputs`)."""
    flags = {name for cls in registry.flag_classes()
             for name in cls.__dataclass_fields__}  # type: ignore[attr-defined]
    for path in (*SHARED, "proxy/config/preflight.py"):
        tree = ast.parse((ROOT / path).read_text())
        # `config.X` / `self.config.X` / `policy.X`: a flag read off the policy's configuration
        read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and ast.unparse(node.value).split(".")[-1] in ("config", "policy")}
        assert not read & flags, f"{path} reads {sorted(read & flags)}"


def test_the_default_policy_is_the_one_module_that_says_so() -> None:
    defaults = [spec.name for spec in registry.policies().values() if spec.default]
    assert defaults == [registry.default_name()] == ["pd"]
    assert PolicyConfig().kind == "pd"


def test_the_files_a_configuration_names_are_read_by_their_policy_modules() -> None:
    config = PolicyConfig(kind="live", table=Path("t.csv"), live_costs=Path("c.json"))
    assert (registry.table_path(config), registry.costs_path(config)) == (
        Path("t.csv"), Path("c.json"))
    assert registry.table_path(PolicyConfig()) is None
