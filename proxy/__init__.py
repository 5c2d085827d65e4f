"""ppd's online router: sessions, policies, backends, the vLLM P/D wire protocol, metrics.

    from proxy import ProxyConfig, create_app, ServerThread
    with ServerThread(create_app(config)) as server: ...  # server.url
"""

from proxy.app import create_app, serve
from proxy.config import ConfigError, NodeSpec, Policy, PolicyConfig, ProxyConfig, config_from_args
from proxy.errors import ProxyError
from proxy.server import Server, ServerThread, running
from proxy.table import TABLE_COLUMNS, DecisionTable, TableError
from proxy.vocabulary import Role, RouteKind, Workload

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
