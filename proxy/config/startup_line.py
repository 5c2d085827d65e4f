"""The line the proxy logs when it is up: where it listens, its policy, its nodes."""

from __future__ import annotations

from proxy.config.settings import ProxyConfig
from proxy.policies import registry


def startup_line(config: ProxyConfig, url: str) -> str:
    """What an operator needs to know the proxy came up as intended: where it listens, the
    policy with what it was given (its module's `describe`), and the nodes."""
    policy = config.policy
    spec = registry.get(policy.kind)
    detail = spec.describe(policy)
    if spec.needs.live_view:
        detail += f"{', ' if detail else ''}KV events from {len(config.kv_events)} nodes"
    detail = f" ({detail})" if detail else ""
    nodes = ", ".join(f"{n.role.value}={n.url}" for n in config.nodes) or "none yet"
    if config.discovery:
        nodes += f" (+ registered via {config.discovery})"
    return f"ppd proxy listening on {url}; policy {policy.kind.value}{detail}; nodes: {nodes}"
