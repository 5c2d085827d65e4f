"""ppd's online router: sessions, policies, backends, the vLLM P/D wire protocol, metrics.

    from proxy import ProxyConfig, create_app, ServerThread
    with ServerThread(create_app(config)) as server: ...  # server.url

The names below are imported on first use (PEP 562), not with the package: a tool that needs
one small module (`proxy.vocabulary`, `proxy.config`) does not pay for the web stack
(Quart, aiohttp) that `create_app` pulls in - `ppd COMMAND --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.app import create_app, serve
    from proxy.config import (
        ConfigError,
        NodeSpec,
        Policy,
        PolicyConfig,
        ProxyConfig,
        config_from_args,
    )
    from proxy.errors import ProxyError
    from proxy.server import Server, ServerThread, running
    from proxy.table import TABLE_COLUMNS, DecisionTable, TableError
    from proxy.vocabulary import Role, RouteKind, Workload

# exported name -> the module that defines it
_SOURCES = {
    "ConfigError": "proxy.config",
    "DecisionTable": "proxy.table",
    "NodeSpec": "proxy.config",
    "Policy": "proxy.config",
    "PolicyConfig": "proxy.config",
    "ProxyConfig": "proxy.config",
    "ProxyError": "proxy.errors",
    "Role": "proxy.vocabulary",
    "RouteKind": "proxy.vocabulary",
    "Server": "proxy.server",
    "ServerThread": "proxy.server",
    "TABLE_COLUMNS": "proxy.table",
    "TableError": "proxy.table",
    "Workload": "proxy.vocabulary",
    "config_from_args": "proxy.config",
    "create_app": "proxy.app",
    "running": "proxy.server",
    "serve": "proxy.app",
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
