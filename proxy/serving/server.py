"""Running an ASGI app (the proxy, or a test's fake vLLM) on a loopback port.

- `serve_app(app, host, port, grace)`: blocking (`proxy.serving.app.serve` runs the proxy on it);
  SIGINT/SIGTERM stop accepting connections and let open streams finish for up to
  `--shutdown-grace` seconds before they are cut.
- `running(app, host, port)`: async context manager yielding a `Server` (url, port); port 0
  lets the OS choose, so tests and in-process demos never collide.
- `ServerThread`: the same in a background thread with its own event loop, for synchronous
  callers (e2e tests, the demo): `with ServerThread(create_app(cfg)) as server: server.url`.

The server is uvicorn with httptools (and uvloop when this module owns the event loop), the
fastest of hypercorn, uvicorn and granian for the proxy in benchmarks/proxy_overhead;
`server=ServerKind.HYPERCORN` keeps the previous server for comparisons. Either way this
module binds the socket itself (so port 0 is known before serving) and runs the app's
lifespan itself (`proxy.serving.lifespan`): start-up before listening, shutdown after the last
connection, and a failing start-up raises in the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from proxy.serving import heap
from proxy.serving.http_server import SHUTDOWN_GRACE_S, hypercorn_serving, uvicorn_serving
from proxy.serving.lifespan import Lifespan

log = logging.getLogger("ppd.proxy")

class ServerKind(enum.StrEnum):
    """The ASGI servers `running` can use."""

    UVICORN = "uvicorn"
    HYPERCORN = "hypercorn"


@dataclass(frozen=True, slots=True)
class Server:
    """A running server's address."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://{self.host}:{self.port}"


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet), for a server to take over."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it Nagle holds each small write of a reply for the client's delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # several worker processes share the port; the kernel spreads connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


_SERVERS = {ServerKind.UVICORN: uvicorn_serving, ServerKind.HYPERCORN: hypercorn_serving}


@contextlib.asynccontextmanager
async def running(app: Any, host: str = "127.0.0.1", port: int = 0,
                  grace: float = SHUTDOWN_GRACE_S, reuse_port: bool = False, *,
                  server: ServerKind = ServerKind.UVICORN) -> AsyncIterator[Server]:
    """Serve app in a background task for the block; on exit, open streams get `grace` s.

    `reuse_port`: several processes may listen on the port (SO_REUSEPORT; the kernel spreads
    the connections), since every server here takes over the socket bound by `listen`.
    """
    sock = listen(host, port, reuse_port)
    address = Server(host, sock.getsockname()[1])
    lifespan = Lifespan(app)
    try:
        await lifespan.startup()
    except BaseException:
        sock.close()
        raise
    stop = asyncio.Event()
    task = asyncio.create_task(_SERVERS[server](app, sock, stop, grace))
    try:
        await _wait_ready(address, task)
        yield address
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, grace + 5)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        await lifespan.shutdown()


async def _wait_ready(server: Server, task: asyncio.Task[None]) -> None:
    # The server listens once it started: a connect means ready.
    for _ in range(500):
        if task.done():
            task.result()  # raises the start-up error
            raise RuntimeError("server stopped during start-up")
        try:
            _, writer = await asyncio.open_connection(server.host, server.port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise TimeoutError(f"server on {server.url} did not start")


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run on uvloop's event loop where uvloop is installed (Linux, macOS)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


class ServerThread:
    """Serve an app from a background thread (its own event loop) until stop()."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 grace: float = SHUTDOWN_GRACE_S) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._grace = grace
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ppd-server", daemon=True)
        self.server: Server | None = None

    @property
    def url(self) -> str:
        """The base URL (after start())."""
        if self.server is None:
            raise RuntimeError("server not started")
        return self.server.url

    def start(self) -> ServerThread:
        """Start serving; returns once requests can be made (or raises the start-up error)."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Shut down gracefully and join the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self._grace + 10)

    def _run(self) -> None:
        run_loop(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with running(self._app, self._host, self._port, self._grace) as server:
                self.server = server
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # hand any start-up failure to the caller's thread
            self._error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve_app(app: Any, host: str, port: int, grace: float = SHUTDOWN_GRACE_S,
              on_ready: Callable[[Server], None] | None = None,
              reuse_port: bool = False) -> None:
    """Run an ASGI app on host:port until SIGINT or SIGTERM (blocking), then drain open
    streams for `grace` s; `on_ready` runs once the socket is bound and the app started (so a
    busy port never gets announced)."""
    run_loop(_serve_until_signal(app, host, port, grace, on_ready, reuse_port))


async def _serve_until_signal(app: Any, host: str, port: int, grace: float,
                              on_ready: Callable[[Server], None] | None = None,
                              reuse_port: bool = False) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running(app, host, port, grace, reuse_port) as server:
        heap.settle()  # the app has started: what it built stays
        if on_ready is not None:
            on_ready(server)
        await stop.wait()
        log.info("stopping: no new connections; open streams get up to %.0f s", grace)
