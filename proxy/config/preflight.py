"""The proxy's configuration built and its policy loaded, without serving: what `ppd proxy`
does first (`create_app` calls `load_policy`), callable by whoever starts a proxy.

`ppd cluster up --with-proxy` calls `check_proxy_args` before it starts any node, so a
misspelt policy, a missing table or cost file, or flags that do not fit the policy fail in a
second instead of after the nodes' start-up - from the same code the proxy runs, not from a
list of rules kept beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config.policy_config import PolicyConfig
from proxy.config.settings import ProxyConfig, config_from_args
from proxy.live.predict import StepCosts
from proxy.policies import registry
from proxy.policies.routing import RoutingPolicy
from proxy.policies.table import DecisionTable


def load_policy(config: PolicyConfig) -> RoutingPolicy:
    """The routing policy of `config`, its decision table and step costs loaded (their
    errors - a missing or malformed file - raise here)."""
    table_path, costs_path = registry.table_path(config), registry.costs_path(config)
    table = DecisionTable.load(table_path) if table_path else None
    costs = StepCosts.load(costs_path) if costs_path else None
    return RoutingPolicy(config, table, costs)


def check_proxy_args(argv: Sequence[str]) -> ProxyConfig:
    """`ppd proxy ARGV`'s configuration, built and its policy loaded; ConfigError (or the
    table's and cost file's own errors) when the proxy would refuse to start."""
    config = config_from_args(argv, exit_on_error=False)
    load_policy(config.policy)
    return config
