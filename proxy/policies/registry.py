"""Every policy by name: the modules of this package that set `NAME` (`proxy.policies.base`).

Dropping a module in is enough: the `--policy` choices and flags
(`proxy.config.policy_config.PolicyConfig`),
the startup line, the simulator's labels (`ppd sim grid --policies`, run names) and the
checks on what a policy needs and which nodes serve it all come from here, and so do the
report labels other code names policies by (`label`, `fixed_label`): a policy's name is
written in its own module alone.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from proxy.policies.base import PD_PAIR, Needs
from proxy.shared.vocabulary import Role

_PACKAGE = "proxy.policies"
_MACHINERY = frozenset({"base", "registry", "routing"})  # not policies


def _nothing(config: Any) -> None:
    return None


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One policy module's declarations, with the defaults filled in."""

    name: str
    decide: Callable[..., Any]
    flags: type | None  # a frozen dataclass of `option(...)` fields, or None
    needs: Needs
    roles: tuple[tuple[Role, ...], ...]  # role sets that serve its turns; [0]: to start
    places: bool  # may place a homeless conversation on a replica (plan_turn tells it can_pd)
    ignores_forcing: bool  # the x-ppd-route header does not apply
    check: Callable[[Any], None]  # rejects a config of this policy (ValueError)
    check_flags: Callable[[Any], None]  # rejects its flags' values, whichever policy runs
    label: Callable[[Any], str]
    parse_label: Callable[[str, Callable[[], Path | None]], dict[str, Any] | None]
    label_help: str
    describe: Callable[[Any], str]
    remember: Callable[[Any], Any] | None  # the learned state decide is given and returns
    # Its `Inputs` from its config, table and step costs, loaded once (None: as given).
    inputs: Callable[[Any, Any, Any], Any] | None
    default: bool  # the policy `--policy` defaults to (exactly one sets DEFAULT = True)
    # The share of turn 2+ it runs locally whatever the turn (pd 0, local 1, fixed its x),
    # from its config; None for a policy that decides turn by turn.
    local_share: Callable[[Any], float] | None

    @property
    def replicas_only(self) -> bool:
        """It starts on replicas alone (no P/D pair): replica."""
        return self.roles[0] == (Role.REPLICA,)

    @classmethod
    def of(cls, module: ModuleType) -> PolicySpec:
        name: str = module.NAME
        flags = getattr(module, "Flags", None)
        if flags is not None and not (isinstance(flags, type) and is_dataclass(flags)):
            raise TypeError(f"policy module {module.__name__}: Flags must be a dataclass")

        def by_name(text: str, table: Callable[[], Path | None]) -> dict[str, Any] | None:
            return {} if text == name else None

        share = getattr(module, "local_share", None)
        if share is None and hasattr(module, "LOCAL_SHARE"):
            constant = float(module.LOCAL_SHARE)
            share = lambda config: constant  # noqa: E731

        return cls(
            name=name, decide=module.decide, flags=flags,
            needs=getattr(module, "NEEDS", Needs()),
            roles=getattr(module, "ROLES", (PD_PAIR,)),
            places=getattr(module, "PLACES", False),
            ignores_forcing=getattr(module, "IGNORES_FORCING", False),
            check=getattr(module, "check", _nothing),
            check_flags=getattr(module, "check_flags", _nothing),
            label=getattr(module, "label", lambda config: name),
            parse_label=getattr(module, "parse_label", by_name),
            label_help=getattr(module, "LABEL_HELP", name),
            describe=getattr(module, "describe", lambda config: ""),
            remember=getattr(module, "remember", None), local_share=share,
            inputs=getattr(module, "inputs", None), default=getattr(module, "DEFAULT", False))


@functools.cache
def _modules() -> tuple[ModuleType, ...]:
    """Every policy module of the package (those that set NAME), by file name."""
    # The package's directory: the policy modules are found by file name, and the package's
    # own machinery is never imported from here (`routing` imports this module: a loop).
    modules = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]),
                       key=lambda i: i.name):
        if info.name in _MACHINERY:
            continue
        module = importlib.import_module(f"{_PACKAGE}.{info.name}")
        if hasattr(module, "NAME"):  # else a module the policies share, not a policy
            modules.append(module)
    return tuple(modules)


@functools.cache
def policies() -> dict[str, PolicySpec]:
    """Every policy module of the package, by name (sorted)."""
    found: dict[str, PolicySpec] = {}
    for module in _modules():
        spec = PolicySpec.of(module)
        if spec.name in found:
            raise ValueError(f"two policy modules are named {spec.name!r}")
        found[spec.name] = spec
    return found


def default_name() -> str:
    """The policy `--policy` defaults to: the one module that sets `DEFAULT = True`."""
    chosen = [spec.name for spec in policies().values() if spec.default]
    if len(chosen) != 1:
        raise ValueError(f"exactly one policy module sets DEFAULT = True, not {chosen}")
    return chosen[0]


def table_path(config: Any) -> Path | None:
    """The decision table a configuration names, as the policy module that declares the flag
    reads it (its `table_path`); None: none named."""
    return _first_path("table_path", config)


def costs_path(config: Any) -> Path | None:
    """The step-cost file a configuration names (the declaring module's `costs_path`)."""
    return _first_path("costs_path", config)


def _first_path(hook: str, config: Any) -> Path | None:
    for module in _modules():
        read = getattr(module, hook, None)
        if read is not None and (path := read(config)) is not None:
            return Path(path)
    return None


def names() -> tuple[str, ...]:
    """The `--policy` choices."""
    return tuple(policies())


def get(name: str) -> PolicySpec:
    """One policy by name (ValueError naming the choices when there is none)."""
    try:
        return policies()[str(name)]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose from {', '.join(names())})") \
            from None


def flag_classes() -> tuple[type, ...]:
    """Every policy's Flags, a class another extends left out (live's extend ppd's)."""
    classes = {spec.flags for spec in policies().values() if spec.flags is not None}
    return tuple(c for c in sorted(classes, key=lambda c: c.__module__)
                 if not any(other is not c and issubclass(other, c) for other in classes))


def parse_label(label: str, table: Callable[[], Path | None]) -> tuple[str, dict[str, Any]]:
    """A report label (`x=0.33`, `ppd-wtpot3`, `live-table`, ...) as (policy, flags);
    `table` gives the grid's decision table to a label that needs one."""
    label = label.strip()
    for spec in policies().values():
        flags = spec.parse_label(label, table)
        if flags is not None:
            return spec.name, flags
    if label in policies():
        return label, {}  # its flags missing: PolicyConfig says which
    forms = ", ".join(spec.label_help for spec in policies().values())
    raise ValueError(f"unknown policy {label!r}: use {forms}")


def label(name: str, **flags: Any) -> str:
    """Policy `name`'s report label with these flags, its other flags at their defaults:
    `label("fixed", x=0.33)` is `x=0.33`, `label("ppd", w_tpot=3)` `ppd-wtpot3` (the inverse
    of `parse_label`)."""
    spec = get(name)
    config = spec.flags(**flags) if spec.flags is not None else SimpleNamespace(**flags)
    return spec.label(config)


def fixed_label(x: float) -> str:
    """The label of the policy that runs a share x of turn 2+ locally whatever the turn (the
    PPD paper's x): the policy that always does (x=0: pd, x=1: local), else the one whose
    flag `x` sets it (`x=0.33`)."""
    for spec in policies().values():
        share = spec.local_share
        if share is not None and spec.flags is None and share(None) == x:
            return spec.name
    for spec in policies().values():
        if spec.local_share is not None and spec.flags is not None:
            return label(spec.name, x=x)
    raise ValueError(f"no policy runs a fixed share {x:g} of turns locally")


def local_share(text: str) -> float | None:
    """The share of turn 2+ a report label's policy runs locally whatever the turn (`pd` 0,
    `x=0.33` 0.33, `local` 1), or None for one that decides turn by turn (ppd, live...)."""
    for spec in policies().values():
        if spec.local_share is None:
            continue
        flags = spec.parse_label(text.strip(), lambda: None)
        if flags is not None:
            config = spec.flags(**flags) if spec.flags is not None else None
            return spec.local_share(config)
    return None
