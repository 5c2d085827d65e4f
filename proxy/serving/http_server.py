"""The HTTP server under the proxy: its settings, uvicorn's protocol with per-request
deadlines, the app's disconnect signal and the app's direct requests (`proxy.serving.direct`:
the completion POSTs, answered without ASGI), and hypercorn kept for comparison.

`proxy.serving.server` binds the socket and runs the lifespan; this module only turns a bound
socket and an app into a serving coroutine (`uvicorn_serving`, `hypercorn_serving`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from proxy.serving.responders import DirectApp
from proxy.shared.errors import BadRequest, ProxyError, RequestTimeout

# Every setting of the HTTP server lives here (a proxy in front of many short-lived clients):
# - An idle keep-alive connection closes after KEEP_ALIVE_S. The timer runs only while a
#   connection is idle (a request in progress stops it), so it never cuts a slow first token.
#   It outlives the idle expiry of the usual clients' pools (httpx and the openai SDK 5 s,
#   aiohttp 15 s), so the client closes first: at 5 s a client that sent its next request
#   just as the server gave up on the connection got a reset (uvicorn, `make soak` at 500
#   clients: 53-196 of ~2,700 requests lost, ReadError; 0 at 20 s). With hypercorn's 75 s,
#   connections whose clients had gone piled up in CLOSE-WAIT (hypercorn closed them only
#   when the timer fired); uvicorn closes them when the client does.
# - LISTEN_BACKLOG connections may wait for accept() (the kernel caps it at
#   net.core.somaxconn); hypercorn's 100 dropped requests on bursts of 500 new clients.
# - A graceful shutdown lets open streams finish for `grace` seconds: `ppd proxy` passes
#   --shutdown-grace (30 s by default); in-process servers (tests, demo) wait SHUTDOWN_GRACE_S.
# - A request's headers must arrive within HEADER_TIMEOUT_S of its first byte and its body
#   within BODY_TIMEOUT_S of its headers, or the connection gets a 408 and is closed; a new
#   connection that sends nothing closes quietly after KEEP_ALIVE_S, as an idle one. Without a
#   deadline a client sending a byte a second held its connection forever (issue 23; 200
#   such connections were all held). These are totals, not idle timers (nginx's
#   client_header/body_timeout reset on every read, which a byte a second defeats). An API
#   client sends its headers in one packet and a body of at most --max-body-bytes (16 MiB:
#   ~1.3 s at 100 Mbit/s), so both leave a wide margin.
#   Uvicorn has neither (only the idle keep-alive timer); `_uvicorn`'s protocol adds them.
KEEP_ALIVE_S = 20.0
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
LISTEN_BACKLOG = 2048
SHUTDOWN_GRACE_S = 5.0


# The scope extension through which the server tells the app its client left (uvicorn only).
DISCONNECT_EXTENSION = "ppd.disconnect"


class DisconnectSignal:
    """Calls `callback` (set by the app, once the request is read) when the client's
    connection is lost before the response completed. An ASGI app learns that only by
    awaiting `receive()`, which takes a task per request to watch; the server already knows
    (its protocol's connection_lost)."""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


def uvicorn_serving(app: Any, sock: socket.socket, stop: asyncio.Event, grace: float
             ) -> Coroutine[Any, Any, None]:
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from proxy.serving.direct import serve_direct  # imports uvicorn

    # The app's own hook for the requests it serves without ASGI (a Quart app keeps its ASGI
    # callable, where the completion endpoints sit, as `asgi_app`).
    target = getattr(app, "asgi_app", app)
    direct = target.direct if isinstance(target, DirectApp) else None
    header_timeout, body_timeout, idle_timeout = HEADER_TIMEOUT_S, BODY_TIMEOUT_S, KEEP_ALIVE_S

    class Protocol(HttpToolsProtocol):
        # One deadline at a time: a new connection's first byte, then the headers' (from the
        # request's first byte), then the body's (from the headers); cleared once the request
        # is read whole (uvicorn's keep-alive timer takes over between requests).
        # The parser's callbacks only say which deadline applies (`_wanted`); it is armed once
        # the bytes at hand are parsed, so a request read whole in one `data_received` - the
        # usual case - sets no timer at all (two set-and-cancels a request before).
        _deadline: asyncio.TimerHandle | None = None
        _wanted: tuple[float, str] | None = None
        _begun = False  # a byte of the current request has arrived

        def send_400_response(self, msg: str) -> None:
            # A request the HTTP parser refuses (bad bytes in a header, a broken request
            # line) gets the proxy's OpenAI-shaped error like every other refusal.
            self._close_with(b"400 Bad Request", BadRequest(f"malformed HTTP request: {msg}"))

        def _close_with(self, status: bytes, error: ProxyError) -> None:
            self._clear_deadline()
            body = error.body_bytes()
            self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json"
                                 b"\r\ncontent-length: " + str(len(body)).encode()
                                 + b"\r\nconnection: close\r\n\r\n" + body)
            self.transport.close()

        def _arm(self, seconds: float, what: str) -> None:
            self._clear_deadline()
            self._deadline = self.loop.call_later(seconds, self._expired, seconds, what)

        def _clear_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self, seconds: float, what: str) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if not self._begun:
                # Not a byte of a request: close quietly, like an idle keep-alive connection
                # (a 408 here could be read as the answer to a request sent just now).
                self.transport.close()
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.response_started:  # cannot happen before the body is read; be safe
                    self.transport.close()
                    return
                # The app is waiting for the body: it reads a disconnect, its answer goes
                # nowhere, and the client gets the 408.
                cycle.disconnected = True
                cycle.message_event.set()
            self._close_with(b"408 Request Timeout",
                             RequestTimeout(f"the request's {what} did not arrive within "
                                            f"{seconds:g} s"))

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            wanted = self._wanted
            if wanted is not None:
                self._wanted = None
                if not self.transport.is_closing():
                    self._arm(*wanted)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            # Until its first byte, a new connection is as idle as a kept-alive one.
            self._arm(idle_timeout, "first byte")

        def connection_lost(self, exc: Exception | None) -> None:
            self._clear_deadline()
            cycle = self.cycle
            super().connection_lost(exc)
            if cycle is not None and not cycle.response_complete:
                signal: DisconnectSignal = cycle.scope["extensions"][DISCONNECT_EXTENSION]  # type: ignore[typeddict-item, assignment]
                signal.fire()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._begun = True
            self._clear_deadline()  # a new connection's first-byte deadline
            self._wanted = (header_timeout, "headers")

        def on_headers_complete(self) -> None:
            # Before uvicorn builds the request's cycle from the scope and starts the app
            # (`_start_asgi_task`; the task runs from the next turn of the loop).
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[DISCONNECT_EXTENSION] = DisconnectSignal()
            super().on_headers_complete()
            self._wanted = (body_timeout, "body")

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            # uvicorn starts a request here (at once, or when a pipelined one before it is
            # answered); a request the app serves directly runs `serve_direct` instead of the
            # ASGI cycle. Not when uvicorn swapped the app (its concurrency limit's 503).
            handler = direct(cycle.scope) if direct is not None and app is self.app else None
            if handler is None:
                super()._start_asgi_task(cycle, app)
                return
            task = self.loop.create_task(serve_direct(cycle, handler))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def on_message_complete(self) -> None:
            self._clear_deadline()
            self._wanted = None
            self._begun = False
            super().on_message_complete()

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:  # signals belong to whoever runs the loop
            yield

    # log_config None: uvicorn's messages go to the logging the caller configured.
    # proxy_headers off: nothing here reads the client address, and it costs per request.
    config = uvicorn.Config(app, http=Protocol, lifespan="off", access_log=False,
                            log_config=None, proxy_headers=False,
                            timeout_keep_alive=int(KEEP_ALIVE_S), backlog=LISTEN_BACKLOG,
                            timeout_graceful_shutdown=max(1, round(grace)))
    server = Server(config)

    async def serve() -> None:
        watch = asyncio.create_task(stop.wait())
        watch.add_done_callback(lambda _: setattr(server, "should_exit", True))
        try:
            await server.serve(sockets=[sock])
        finally:
            watch.cancel()

    return serve()


def hypercorn_serving(app: Any, sock: socket.socket, stop: asyncio.Event, grace: float
               ) -> Coroutine[Any, Any, None]:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    config = HypercornConfig()
    # Hypercorn takes over the already-bound socket, so the port chosen for port 0 is known.
    config.bind = [f"fd://{sock.detach()}"]
    config.graceful_timeout = grace
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.backlog = LISTEN_BACKLOG

    async def no_lifespan(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                          send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":  # run by this module, not by hypercorn
            raise RuntimeError("lifespan is handled by proxy.serving.server")
        await app(scope, receive, send)

    return hypercorn_serve(no_lifespan, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
