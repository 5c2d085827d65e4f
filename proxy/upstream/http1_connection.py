"""One HTTP/1.1 exchange on one connection, for `proxy.upstream.http1`'s pool: an asyncio
protocol feeding httptools' C parser, and the exchange that the answer's head and body go to,
with its read timeout and the failure a cut connection means for failover.
"""

from __future__ import annotations

import asyncio
import collections

import httptools

from proxy.shared.errors import UpstreamBroken
from proxy.upstream.legs import broken, timed_out

# Body bytes buffered for a reader that does not keep up before the socket stops being read
# (the kernel's buffers then push back on the node, as vLLM expects from a slow client).
_HIGH_WATER = 256 * 1024


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one exchange at a time; also the parser's callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: Exchange | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None or exchange.finished:  # bytes nobody asked for: not reusable
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            exchange.fail(exchange.broken("unexpected protocol upgrade"))
            self.close()
        except httptools.HttpParserError as exc:
            exchange.fail(exchange.broken(f"invalid HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._exchange is not None:
            self._exchange.lost(exc)

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._exchange.header(name, value)  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        self._exchange.headers_done(self._parser.get_status_code())  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        # The exchange's buffer filled here, not through a method of its own: httptools calls
        # this once per chunk of the answer's framing (vLLM: one per SSE event, ~17 a reply).
        # No clock read: `_last` matters only while a read waits, and `Exchange._wait` sets
        # it when the wait begins.
        exchange = self._exchange
        assert exchange is not None
        exchange._chunks.append(body)
        exchange._buffered += len(body)
        if exchange._buffered > _HIGH_WATER and not exchange._paused:
            exchange._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        if exchange._waiter is not None:
            exchange._wake()

    def on_message_complete(self) -> None:
        exchange = self._exchange
        assert exchange is not None
        exchange.reusable = self._parser.should_keep_alive()
        exchange.complete()

    # the pool's side

    def start(self, exchange: Exchange, request: bytes) -> None:
        self._exchange = exchange
        self.transport.write(request)  # type: ignore[union-attr]

    def finish(self) -> None:
        self._exchange = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Exchange:
    """One request's answer as it arrives: status, content type, then body chunks."""

    __slots__ = ("status", "content_type", "reusable", "_loop", "_conn", "_url",
                 "_read_timeout", "_chunks", "_buffered", "_paused", "_waiter", "_error",
                 "_headers_done", "_eof", "_last", "_timer", "_framed")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Connection, url: str,
                 read_timeout: float | None) -> None:
        self._loop = loop
        self._conn = conn
        self._url = url  # named in its errors
        self._read_timeout = read_timeout
        self.status = 0
        self.content_type = "application/json"
        self.reusable = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._headers_done = False
        self._eof = False
        self._framed = False  # the body has a length or chunked framing (else: until close)
        self._last = loop.time()
        self._timer: asyncio.TimerHandle | None = None
        if read_timeout is not None:
            self._timer = loop.call_at(self._last + read_timeout, self._check_timeout)

    # from the connection

    def header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lower == b"content-length" or lower == b"transfer-encoding":
            self._framed = True

    def headers_done(self, status: int) -> None:
        self.status = status
        self._headers_done = True
        self._wake()

    def complete(self) -> None:
        self._eof = True
        self._stop_timer()
        self._wake()

    def lost(self, exc: Exception | None) -> None:
        if self._eof:
            return
        if self._headers_done and not self._framed and exc is None:
            self.complete()  # a body delimited by the connection's end is whole
            return
        detail = f": {exc}" if exc else ""
        self.fail(self.broken(f"connection closed inside the response body{detail}"
                              if self._headers_done else
                              f"server disconnected without sending a response{detail}"))

    def broken(self, detail: str) -> UpstreamBroken:
        """The error of a connection that failed after it was made (`proxy.upstream.legs`)."""
        return broken(self._url, detail)

    def fail(self, error: BaseException) -> None:
        if self._error is None and not self._eof:
            self._error = error
            self._stop_timer()
            self._wake()

    # timing

    def _check_timeout(self) -> None:
        # One timer per exchange, moved only when it fires: a read that waited `read` seconds
        # with no byte fails; chunks arriving in time cost no timer operations.
        self._timer = None
        if self._eof or self._error is not None:
            return
        timeout = self._read_timeout
        assert timeout is not None
        now = self._loop.time()
        if self._waiter is None:  # the reader is busy elsewhere: nothing is waiting on a read
            self._timer = self._loop.call_at(now + timeout, self._check_timeout)
        elif now >= self._last + timeout:
            self.fail(timed_out(self._url, f"no data for {timeout:g} s"))
            self._conn.close()
        else:
            self._timer = self._loop.call_at(self._last + timeout, self._check_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # the reader's side

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        self._last = self._loop.time()  # a read's wait starts now
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    async def headers(self) -> None:
        while not self._headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def readany(self) -> bytes:
        """The bytes that arrived since the last read (b"" at the end)."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._wait()
        chunks = self._chunks
        if len(chunks) == 1:
            data = chunks.popleft()
        else:
            data = b"".join(chunks)
            chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._conn.transport.resume_reading()  # type: ignore[union-attr]
        return data

    @property
    def finished(self) -> bool:
        return self._eof

    @property
    def at_end(self) -> bool:
        return self._eof and not self._chunks

    def abandon(self) -> None:
        self._stop_timer()
