"""Completion requests served on uvicorn's connection without ASGI: the proxy's hot path.

uvicorn reads and frames every request (parser, keep-alive, pipelining, flow control, the
body through its cycle's `receive`); for a request the app serves directly
(`proxy.serving.responders.DirectApp`) the response is written here, as bytes, instead of
through the cycle's ASGI `send`. That `send` built a message dict and ran two regexes per
header line on every call, and the app's call went through Quart's and the completion app's
ASGI entry points: ~8% of the proxy's CPU per request at concurrency 1 (py-spy,
benchmarks/proxy_overhead). The cycle's state is kept as uvicorn's `send` keeps it
(`response_started`, `response_complete`, `keep_alive`, `on_response`), so keep-alive,
pipelined requests, graceful shutdown and disconnects work as for any other request.

A stream's head is held and written with its first chunk (one write, one packet: the router
has the first chunk at hand when it answers); a stream's last chunk carries the chunked
encoding's end. Header names and values are checked as uvicorn checks them, once per
response over all of them: a CR or LF from anywhere cannot split the response.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from proxy.serving.responders import DirectHandler, Headers

log = logging.getLogger("ppd.proxy")

# uvicorn's own checks (httptools_impl.HEADER_RE, HEADER_VALUE_RE): a name is an HTTP token,
# a value holds no control character but tab.
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNKED = b"transfer-encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"


class DirectResponder:
    """A `proxy.serving.responders.Responder` writing on a uvicorn cycle's transport."""

    __slots__ = ("_cycle", "_head")
    # A write goes to the transport in the same step (a paused transport is waited for
    # before the write, never after it).
    writes_at_once = True

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle  # uvicorn.protocols.http.httptools_impl.RequestResponseCycle
        self._head: bytes | None = None

    def _head_bytes(self, status: int, headers: Headers, framing: bytes) -> bytes:
        cycle = self._cycle
        headers = cycle.default_headers + headers  # uvicorn's date and server lines
        if (_BAD_NAME.search(b"".join([name for name, _ in headers]))
                or _BAD_VALUE.search(b"".join([value for _, value in headers]))):
            raise RuntimeError("Invalid HTTP header name or value.")
        lines = [STATUS_LINE[status]]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            lines.append(b"connection: close\r\n")
        lines += (framing, b"\r\n")
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        return b"".join(lines)

    async def _writable(self) -> bool:
        """Waits while the client reads slowly; False: the client left."""
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        return not cycle.disconnected

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        if not await self._writable():
            return
        head = self._head_bytes(status, headers, b"content-length: %d\r\n" % len(body))
        self._cycle.transport.write(head + body)
        self._complete()

    async def head(self, status: int, headers: Headers) -> None:
        self._head = self._head_bytes(status, headers, _CHUNKED)

    async def chunk(self, data: bytes, more: bool) -> None:
        if not await self._writable():
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        if not more:
            framed += _LAST_CHUNK
        if self._head is not None:
            framed, self._head = self._head + framed, None
        self._cycle.transport.write(framed)
        if not more:
            self._complete()

    def _complete(self) -> None:
        cycle = self._cycle
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()


async def serve_direct(cycle: Any, handler: DirectHandler) -> None:
    """Run handler on the cycle's request, as uvicorn's `run_asgi` runs an app: a handler
    that fails before answering is a 500, after it (or one that never finishes its answer)
    closes the connection."""
    responder = DirectResponder(cycle)
    try:
        await handler(cycle.scope, cycle.receive, responder)
    except BaseException as exc:
        log.error("unexpected error serving %s: %s", cycle.scope.get("path"), exc, exc_info=exc)
        if not cycle.response_started and not cycle.disconnected:
            cycle.keep_alive = False
            await responder.whole(500, [(b"content-type", b"text/plain; charset=utf-8")],
                                  b"Internal Server Error")
        else:
            cycle.transport.close()
    else:
        if not cycle.response_complete and not cycle.disconnected:
            log.error("the response to %s was not completed", cycle.scope.get("path"))
            cycle.transport.close()
    finally:
        cycle.on_response = lambda: None
