"""The line the proxy logs when it is up: where it listens, its policy, its nodes."""

from __future__ import annotations

from proxy.config import Policy, ProxyConfig


def startup_line(config: ProxyConfig, url: str) -> str:
    """What an operator needs to know the proxy came up as intended: where it listens, the
    policy with its table and weights, and the nodes."""
    policy = config.policy
    detail = ""
    if policy.kind is Policy.PPD:
        detail = (f" (table {policy.table}, w_ttft={policy.w_ttft:g}, w_tpot={policy.w_tpot:g}, "
                  f"success margin {policy.success_margin:g})")
    elif policy.kind is Policy.FIXED:
        detail = f" (x={policy.x:g})"
    elif policy.kind is Policy.LIVE:
        detail = (f" (costs {policy.live_costs}, w_ttft={policy.w_ttft:g}, "
                  f"w_tpot={policy.w_tpot:g}, KV events from {len(config.kv_events)} nodes)")
    elif policy.kind is Policy.THRESHOLD:
        detail = f" (non-cached tokens <= {policy.non_cached_tokens})"
    nodes = ", ".join(f"{n.role.value}={n.url}" for n in config.nodes) or "none yet"
    if config.discovery:
        nodes += f" (+ registered via {config.discovery})"
    return f"ppd proxy listening on {url}; policy {policy.kind.value}{detail}; nodes: {nodes}"
