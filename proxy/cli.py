"""`ppd proxy`: parse flags (and the files they name) into a ProxyConfig and serve it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proxy.config.settings import config_from_args

if TYPE_CHECKING:
    from proxy.serving.server import Server

log = logging.getLogger("ppd.proxy")


def main(argv: list[str]) -> int:
    """Run the proxy until SIGINT/SIGTERM; configuration errors raise with a clear message."""
    config = config_from_args(argv)
    # The web stack (Quart, aiohttp, uvicorn) once the flags are good: --help and usage
    # errors return without it.
    from proxy.config.startup_line import startup_line
    from proxy.observability.logs import configure
    from proxy.serving.app import create_app
    from proxy.serving.server import serve_app
    from proxy.serving.workers import serve_workers

    configure(config.log_level, config.log_format)
    app = create_app(config)  # loads the table and tokenizer: their errors surface here
    if config.workers > 1:
        return serve_workers(config)  # each worker builds its own app and announces itself

    def announce(server: Server) -> None:
        log.info("%s", startup_line(config, server.url))

    serve_app(app, config.host, config.port, config.shutdown_grace, on_ready=announce)
    return 0
