"""`PolicyConfig` and `Policy`: which policy decides routes, with every policy's flags.

Both are built when this module loads, from the policy registry (`proxy.policies.registry`):
a policy module dropped into proxy/policies/ becomes a `--policy` choice and brings its flags,
and nothing here names a policy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, make_dataclass
from typing import TYPE_CHECKING, Any

from proxy.config.config_files import ConfigError
from proxy.policies import registry
from proxy.policies.base import Need
from proxy.shared.options import option
from proxy.shared.suggest import unknown_name


def _policy_enum() -> type[enum.StrEnum]:
    """The routing policies, one member per module of `proxy.policies` (its registry)."""
    return enum.StrEnum(  # type: ignore[return-value]
        "Policy", {name.upper().replace("-", "_"): name for name in registry.names()},
        module=__name__)


if TYPE_CHECKING:
    class Policy(enum.StrEnum):
        """The routing policies (a member per `proxy.policies` module)."""

else:
    Policy = _policy_enum()


def policy_names() -> tuple[str, ...]:
    """Every routing policy's name, from the one place that lists them (the registry)."""
    return registry.names()


def parse_policy_name(name: str) -> Policy:
    """A policy by name; an unknown one is a ConfigError with "did you mean" and the list."""
    if name in policy_names():
        return Policy(name)
    raise ConfigError(unknown_name("policy", str(name), policy_names()))


@dataclass(frozen=True)
class _PolicyKind:
    kind: Policy = option(Policy(registry.default_name()), "routing policy", flag="policy",
                          parse=parse_policy_name)


def _check_policy(config: Any) -> None:
    """Every policy's flag values, then what the chosen policy needs."""
    try:
        if not isinstance(config.kind, Policy):
            object.__setattr__(config, "kind", Policy(registry.get(config.kind).name))
        for spec in registry.policies().values():
            spec.check_flags(config)
        spec = registry.get(config.kind)
        spec.check(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if spec.needs.table is Need.REQUIRED and registry.table_path(config) is None:
        raise ConfigError(f"policy {spec.name} needs --table PATH (a decision table, CSV or "
                          "Parquet)")


def _policy_config() -> type:
    """`PolicyConfig`: `kind` (`--policy`), then every policy module's Flags."""
    cls = make_dataclass("PolicyConfig", [], bases=(*registry.flag_classes(), _PolicyKind),
                         frozen=True, namespace={"__post_init__": _check_policy,
                                                 "__module__": __name__})
    cls.__doc__ = "Which policy decides routes, with every policy's parameters."
    return cls


if TYPE_CHECKING:
    class PolicyConfig:
        """Which policy decides routes, with every policy's parameters (their Flags)."""

        kind: Policy

        def __init__(self, kind: Policy | str = ..., **flags: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

else:
    PolicyConfig = _policy_config()
