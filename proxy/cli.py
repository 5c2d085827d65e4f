"""`ppd proxy`: parse flags (and the files they name) into a ProxyConfig and serve it."""

from __future__ import annotations

import logging

from proxy.config import config_from_args
from proxy.server import serve


def main(argv: list[str]) -> int:
    """Run the proxy until SIGINT/SIGTERM; configuration errors raise with a clear message."""
    config = config_from_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    nodes = ", ".join(f"{n.role}={n.url}" for n in config.nodes) or "none (discovery)"
    logging.getLogger("ppd.proxy").info(
        "ppd proxy on http://%s:%d, policy %s, nodes: %s",
        config.host, config.port, config.policy.kind, nodes)
    serve(config)
    return 0
