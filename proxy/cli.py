"""`ppd proxy`: parse flags (and the files they name) into a ProxyConfig and serve it."""

from __future__ import annotations

import logging

from proxy.app import create_app
from proxy.config import config_from_args
from proxy.server import serve_app
from proxy.workers import configure_logging, serve_workers


def main(argv: list[str]) -> int:
    """Run the proxy until SIGINT/SIGTERM; configuration errors raise with a clear message."""
    config = config_from_args(argv)
    app = create_app(config)  # loads the table and tokenizer: their errors surface here
    configure_logging()
    nodes = ", ".join(f"{n.role}={n.url}" for n in config.nodes) or "none yet (discovery)"
    logging.getLogger("ppd.proxy").info(
        "ppd proxy on http://%s:%d, policy %s, nodes: %s",
        config.host, config.port, config.policy.kind, nodes)
    if config.workers > 1:
        return serve_workers(config)  # each worker builds its own app
    serve_app(app, config.host, config.port)
    return 0
