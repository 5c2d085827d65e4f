"""`ppd proxy`: parse flags (and the files they name) into a ProxyConfig and serve it."""

from __future__ import annotations

import logging

from proxy.app import create_app
from proxy.config import Policy, ProxyConfig, config_from_args
from proxy.logs import configure
from proxy.server import Server, serve_app
from proxy.workers import serve_workers

log = logging.getLogger("ppd.proxy")


def main(argv: list[str]) -> int:
    """Run the proxy until SIGINT/SIGTERM; configuration errors raise with a clear message."""
    config = config_from_args(argv)
    configure(config.log_level, config.log_format)
    app = create_app(config)  # loads the table and tokenizer: their errors surface here
    if config.workers > 1:
        return serve_workers(config)  # each worker builds its own app and announces itself

    def announce(server: Server) -> None:
        log.info("%s", startup_line(config, server.url))

    serve_app(app, config.host, config.port, config.shutdown_grace, on_ready=announce)
    return 0


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
