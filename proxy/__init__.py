"""ppd's online router: sessions, policies, backends, the vLLM P/D wire protocol, metrics.

    from proxy import ProxyConfig, create_app, ServerThread
    with ServerThread(create_app(config)) as server: ...  # server.url

The names below are imported on first use (PEP 562), not with the package: a tool that needs
one small module (`proxy.shared.vocabulary`, `proxy.config.settings`) does not pay for the web
stack (Quart, aiohttp) that `create_app` pulls in - `ppd COMMAND --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.config.cluster_file import NodeSpec
    from proxy.config.config_files import ConfigError
    from proxy.config.policy_config import Policy, PolicyConfig
    from proxy.config.settings import ProxyConfig, config_from_args
    from proxy.policies.table import TABLE_COLUMNS, DecisionTable, TableError
    from proxy.serving.app import create_app, serve
    from proxy.serving.server import Server, ServerThread, running
    from proxy.shared.errors import ProxyError
    from proxy.shared.vocabulary import Role, RouteKind, Workload

# exported name -> the module that defines it
_SOURCES = {
    "ConfigError": "proxy.config.config_files",
    "DecisionTable": "proxy.policies.table",
    "NodeSpec": "proxy.config.cluster_file",
    "Policy": "proxy.config.policy_config",
    "PolicyConfig": "proxy.config.policy_config",
    "ProxyConfig": "proxy.config.settings",
    "ProxyError": "proxy.shared.errors",
    "Role": "proxy.shared.vocabulary",
    "RouteKind": "proxy.shared.vocabulary",
    "Server": "proxy.serving.server",
    "ServerThread": "proxy.serving.server",
    "TABLE_COLUMNS": "proxy.policies.table",
    "TableError": "proxy.policies.table",
    "Workload": "proxy.shared.vocabulary",
    "config_from_args": "proxy.config.settings",
    "create_app": "proxy.serving.app",
    "running": "proxy.serving.server",
    "serve": "proxy.serving.app",
}

__all__ = [
    "ConfigError",
    "DecisionTable",
    "NodeSpec",
    "Policy",
    "PolicyConfig",
    "ProxyConfig",
    "ProxyError",
    "Role",
    "RouteKind",
    "Server",
    "ServerThread",
    "TABLE_COLUMNS",
    "TableError",
    "Workload",
    "config_from_args",
    "create_app",
    "running",
    "serve",
]


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first access (PEP 562)."""
    try:
        module = _SOURCES[name]
    except KeyError:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_SOURCES])
