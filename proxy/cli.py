"""`ppd proxy`: parse flags (and the files they name) into a ProxyConfig and serve it."""

from __future__ import annotations

import logging

from proxy.app import create_app
from proxy.config import config_from_args
from proxy.server import serve_app


def main(argv: list[str]) -> int:
    """Run the proxy until SIGINT/SIGTERM; configuration errors raise with a clear message."""
    config = config_from_args(argv)
    app = create_app(config)  # loads the table and tokenizer: their errors surface here
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    nodes = ", ".join(f"{n.role}={n.url}" for n in config.nodes) or "none yet (discovery)"
    logging.getLogger("ppd.proxy").info(
        "ppd proxy on http://%s:%d, policy %s, nodes: %s",
        config.host, config.port, config.policy.kind, nodes)
    serve_app(app, config.host, config.port, config.shutdown_grace)
    return 0
