"""The legs' HTTP/1.1 client: one asyncio protocol per connection, httptools' parser, a pool
of idle connections per node.

The proxy's legs need little of a general client: a POST with a body already encoded, the
status and content type of the answer, its body as it arrives, and three failure moments
told apart for failover (`proxy.upstream.forward`): refused (never sent), cut before the answer's
headers, cut in the body. aiohttp's ClientSession paid for everything else - a request and a
response object with their header multidicts, a connector with per-host limits, a stream
reader with its own buffers - and was ~35% of the proxy's CPU on the P->D path
(benchmarks/proxy_overhead, py-spy). Here a request is one write of prebuilt bytes, the answer
is parsed by the same C parser uvicorn uses on the proxy's server side, and body chunks go to
the reader as they arrive.

`Http1Pool` is the default `proxy.upstream.legs.Legs`; its failures are the proxy's own errors,
translated here, where they happen (`proxy.upstream.legs`): UpstreamRefused when the connection
could
not be made (the request was never sent), UpstreamTimeout when connecting or a read waited
longer than its timeout, UpstreamBroken when the connection closed or spoke garbage before
the answer's headers or closed inside the body. Nothing is ever sent twice.

Connections: idle ones are kept per (host, port), newest first, and dropped after
`keepalive_expiry` seconds idle, before vLLM's own 5 s keep-alive closes them (a POST must
never meet a connection the server is closing: it cannot be resent). A body not read to its
end closes its connection, so vLLM aborts that request. Only `http://` URLs
(`proxy.upstream.transport.DefaultLegs` sends the others through aiohttp).
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools

from proxy.shared.errors import UpstreamBroken
from proxy.upstream.legs import KEEPALIVE_EXPIRY_S, LegTimeouts, broken, refused, timed_out

# Body bytes buffered for a reader that does not keep up before the socket stops being read
# (the kernel's buffers then push back on the node, as vLLM expects from a slow client).
_HIGH_WATER = 256 * 1024


@functools.lru_cache(maxsize=1024)
def _target(url: str) -> tuple[tuple[str, int], bytes]:
    """(host, port) and the request line's start and Host header for url (parsed once)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// URL: {url!r}")
    port = parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname if parts.port is None else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:  # an IPv6 literal keeps its brackets in the Host header
        host = f"[{parts.hostname}]" + (f":{port}" if parts.port is not None else "")
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1")
    return (parts.hostname, port), head


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one exchange at a time; also the parser's callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: _Exchange | None = None

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
        self._exchange.body(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        exchange = self._exchange
        assert exchange is not None
        exchange.reusable = self._parser.should_keep_alive()
        exchange.complete()

    # the pool's side

    def start(self, exchange: _Exchange, request: bytes) -> None:
        self._exchange = exchange
        self.transport.write(request)  # type: ignore[union-attr]

    def finish(self) -> None:
        self._exchange = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Exchange:
    """One request's answer as it arrives: status, content type, then body chunks."""

    __slots__ = ("status", "content_type", "reusable", "_loop", "_conn", "_url",
                 "_read_timeout", "_chunks", "_buffered", "_paused", "_waiter", "_error",
                 "_headers_done", "_eof", "_last", "_timer", "_framed")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: _Connection, url: str,
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

    def body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self._last = self._loop.time()
        if self._buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.transport.pause_reading()  # type: ignore[union-attr]
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


class Http1Response:
    """An answer whose headers arrived: status, content type, and the body to read once."""

    __slots__ = ("status", "content_type", "read_chunk", "_exchange", "_pool", "_key", "_conn",
                 "_done")

    def __init__(self, exchange: _Exchange, pool: Http1Pool, key: tuple[str, int],
                 conn: _Connection) -> None:
        self._exchange = exchange
        self._pool = pool
        self._key = key
        self._conn = conn
        self._done = False
        self.status = exchange.status
        self.content_type = exchange.content_type
        # The bytes that arrived since the last read, b"" at the end (`proxy.upstream.legs` errors).
        self.read_chunk = exchange.readany

    @property
    def at_end(self) -> bool:
        """The body's end has arrived and every byte before it was read."""
        return self._exchange.at_end

    async def aread(self) -> bytes:
        """The whole body."""
        parts = []
        while data := await self._exchange.readany():
            parts.append(data)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Back to the pool when read to the end, else the connection is closed."""
        if self._done:
            return
        self._done = True
        exchange = self._exchange
        exchange.abandon()
        self._conn.finish()
        if exchange.at_end and exchange.reusable and not self._conn.closed:
            self._pool.keep(self._key, self._conn)
        else:
            self._conn.close()


class Http1Pool:
    """POSTs over kept-alive HTTP/1.1 connections, idle ones pooled per node
    (`proxy.upstream.legs`)."""

    def __init__(self, timeout: LegTimeouts, headers: Mapping[str, str] | None = None,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._timeout = timeout
        # The headers every leg carries, encoded once.
        self._headers = b"".join(f"{name}: {value}\r\n".encode("latin-1")
                                 for name, value in (headers or {}).items())
        self._keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[str, int], list[_Connection]] = {}  # oldest first
        self._sweep_timer: asyncio.TimerHandle | None = None

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Http1Response:
        """Send content; the answer once its status and headers arrived (`proxy.upstream.legs`
        errors)."""
        key, head = _target(url)
        loop = asyncio.get_running_loop()
        conn = (self._reusable(key, loop.time())
                or await self._connect(loop, key, url, self._timeout.connect))
        request = [head, self._headers]
        for name, value in headers.items():
            request.append(f"{name}: {value}\r\n".encode("latin-1"))
        request.append(b"content-length: %d\r\n\r\n" % len(content))
        request.append(content)
        exchange = _Exchange(loop, conn, url, self._timeout.read)
        conn.start(exchange, b"".join(request))
        try:
            await exchange.headers()
        except BaseException:
            exchange.abandon()
            conn.finish()
            conn.close()
            raise
        return Http1Response(exchange, self, key, conn)

    def _reusable(self, key: tuple[str, int], now: float) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the newest: the least likely to be near its expiry
            if not conn.closed and now - conn.idle_since < self._keepalive_expiry:
                return conn
            conn.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int], url: str,
                       connect_timeout: float | None) -> _Connection:
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), *key)
        except TimeoutError:
            raise timed_out(url, f"connecting took over {connect_timeout:g} s") from None
        except OSError as exc:
            raise refused(url, exc) from exc
        return conn

    def keep(self, key: tuple[str, int], conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.setdefault(key, []).append(conn)
        if self._sweep_timer is None:
            self._sweep_timer = loop.call_later(self._keepalive_expiry, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        # One timer per pool, re-armed while connections stay idle: a burst's connections are
        # closed once idle past their expiry, traffic or not (make soak: 446 descriptors were
        # still open 7 s after 500 clients left, before this sweep).
        self._sweep_timer = None
        oldest = loop.time() - self._keepalive_expiry
        for key, idle in list(self._idle.items()):
            fresh = []
            for conn in idle:
                if not conn.closed and conn.idle_since > oldest:
                    fresh.append(conn)
                else:
                    conn.close()
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]
        if self._idle:
            self._sweep_timer = loop.call_later(self._keepalive_expiry, self._sweep, loop)

    async def aclose(self) -> None:
        """Close every idle connection (the ones in use close with their responses)."""
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
