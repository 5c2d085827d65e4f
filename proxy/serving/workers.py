"""`ppd proxy --workers N`: N proxy processes on one port, sharing sessions through the store.

Each worker is a whole proxy (its app, upstream connections, health checks and session cache)
in its own process, listening on the same host:port with SO_REUSEPORT: the kernel spreads
incoming connections over them, so N workers use N cores. What they must agree on lives in the
shared session store: `--session-store redis://...` (several machines), or, by default, a
redis-server the supervisor runs for them on a Unix socket (`proxy.serving.embedded_store`), so
`ppd proxy --workers 4 ...` needs no other setup. Node health and circuits are per worker
(each learns them from its own checks and legs).

The parent only supervises: it holds the port (so port 0 picks one for all), runs the
embedded store (restarted if it dies), starts the workers (spawned, not forked: no event
loop or thread is inherited), restarts one that dies after running a while, stops all if one
dies at start-up, and on SIGINT/SIGTERM stops them gracefully. Responses carry
`x-ppd-worker: N`; /metrics on any worker covers all (`proxy.observability.worker_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path

from quart import Quart

from proxy.config.settings import ProxyConfig
from proxy.config.startup_line import startup_line
from proxy.observability.logs import configure
from proxy.observability.worker_metrics import PUBLISH_INTERVAL_S, WorkerMetrics
from proxy.serving.app import create_app
from proxy.serving.embedded_store import EmbeddedRedis
from proxy.serving.server import Server, listen, serve_app
from proxy.sessions.store import MEMORY
from proxy.shared.vocabulary import PRODUCT

log = logging.getLogger("ppd.proxy")

# A worker that dies sooner than this after its start is broken, not unlucky: stop everything.
CRASH_WINDOW_S = 5.0
_POLL_S = 0.2


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to host:port with SO_REUSEPORT: it keeps the port for
    the workers, which bind it too, and tells which port 0 picked."""
    return listen(host, port, reuse_port=True)


def attach_worker(app: Quart, worker: int, metrics_dir: Path, parent: int | None) -> None:
    """Make a proxy app worker `worker` of a group: its header, merged metrics, and an exit
    when its parent is gone."""
    state = app.extensions[PRODUCT]
    metrics = WorkerMetrics(metrics_dir, worker, state.metrics.exposition)
    state.exposition = metrics.exposition

    state.response_headers["x-ppd-worker"] = str(worker)  # completions too: endpoints

    async def publish_forever() -> None:
        while True:
            metrics.publish()
            if parent is not None and os.getppid() != parent:
                log.warning("worker %d: the supervising process is gone; stopping", worker)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    @app.before_serving
    async def start() -> None:
        state.tasks.append(asyncio.create_task(publish_forever()))

    @app.after_serving
    async def stop() -> None:
        metrics.retire()


def _worker_main(config: ProxyConfig, worker: int, metrics_dir: str, parent: int) -> None:
    configure(config.log_level, config.log_format)
    app = create_app(config)
    attach_worker(app, worker, Path(metrics_dir), parent)

    def announce(server: Server) -> None:
        log.info("worker %d: %s", worker, startup_line(config, server.url))

    serve_app(app, config.host, config.port, config.shutdown_grace, on_ready=announce,
              reuse_port=True)


class Supervisor:
    """Starts, watches and stops the worker processes."""

    def __init__(self, config: ProxyConfig, metrics_dir: Path,
                 store: EmbeddedRedis | None = None) -> None:
        self.config = config
        self.metrics_dir = metrics_dir
        self.store = store
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[BaseProcess] = []
        self._started: list[float] = []

    def start(self) -> None:
        """Start every worker."""
        for worker in range(self.config.workers):
            self._workers.append(self._spawn(worker))
            self._started.append(time.monotonic())

    def check(self) -> bool:
        """Restart workers (and the embedded store) that died; False if a worker died during
        start-up (give up)."""
        if self.store is not None and not self.store.alive():
            log.warning("the embedded session store exited; restarting it (sessions so far "
                        "are lost: their next turns run P->D)")
            self.store.start()
        for worker, process in enumerate(self._workers):
            if process.is_alive():
                continue
            if time.monotonic() - self._started[worker] < CRASH_WINDOW_S:
                log.error("worker %d exited with code %s during start-up; stopping", worker,
                          process.exitcode)
                return False
            log.warning("worker %d exited with code %s; restarting it", worker, process.exitcode)
            self._workers[worker] = self._spawn(worker)
            self._started[worker] = time.monotonic()
        return True

    def stop(self) -> None:
        """Stop every worker gracefully (SIGTERM), killing those that outlive the grace."""
        for process in self._workers:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + self.config.shutdown_grace + 5
        for process in self._workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()

    def _spawn(self, worker: int) -> BaseProcess:
        process = self._context.Process(
            target=_worker_main, name=f"ppd-worker-{worker}", daemon=False,
            args=(self.config, worker, str(self.metrics_dir), os.getpid()))
        process.start()
        return process


def serve_workers(config: ProxyConfig) -> int:
    """Run config.workers proxy processes on one port until SIGINT/SIGTERM (blocking)."""
    holder = reserve_port(config.host, config.port)
    config = replace(config, port=holder.getsockname()[1])
    metrics_dir = Path(tempfile.mkdtemp(prefix="ppd-workers-"))  # private: mode 700
    store = None
    stop = threading.Event()
    healthy = True
    try:
        if config.session_store == MEMORY:  # one machine: a store of our own
            store = EmbeddedRedis(metrics_dir).start()
            config = replace(config, session_store=store.url)
            log.info("sessions shared by the workers through an embedded redis-server on %s",
                     store.socket_path)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        supervisor = Supervisor(config, metrics_dir, store)
        log.info("ppd proxy on http://%s:%d with %d workers", config.host, config.port,
                 config.workers)
        try:
            supervisor.start()
            while healthy and not stop.wait(_POLL_S):
                healthy = supervisor.check()
        finally:
            supervisor.stop()
    finally:
        if store is not None:
            store.stop()
        holder.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(metrics_dir)
    return 0 if healthy else 1
