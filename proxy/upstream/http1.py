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
translated where they happen (`proxy.upstream.legs`; the connection's side in
`proxy.upstream.http1_connection`): UpstreamRefused when the connection could not be made
(the request was never sent), UpstreamTimeout when connecting or a read waited longer than
its timeout, UpstreamBroken when the connection closed or spoke garbage before the answer's
headers or closed inside the body. Nothing is ever sent twice.

Connections: idle ones are kept per (host, port), newest first, and dropped after
`keepalive_expiry` seconds idle, before vLLM's own 5 s keep-alive closes them (a POST must
never meet a connection the server is closing: it cannot be resent). A body not read to its
end closes its connection, so vLLM aborts that request. Only `http://` URLs
(`proxy.upstream.transport.DefaultLegs` sends the others through aiohttp).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from urllib.parse import urlsplit

from proxy.upstream.http1_connection import Connection, Exchange
from proxy.upstream.legs import KEEPALIVE_EXPIRY_S, LegTimeouts, refused, timed_out


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


class Http1Response:
    """An answer whose headers arrived: status, content type, and the body to read once."""

    __slots__ = ("status", "content_type", "read_chunk", "_exchange", "_pool", "_key", "_conn",
                 "_done")

    def __init__(self, exchange: Exchange, pool: Http1Pool, key: tuple[str, int],
                 conn: Connection) -> None:
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
        self._idle: dict[tuple[str, int], list[Connection]] = {}  # oldest first
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
        exchange = Exchange(loop, conn, url, self._timeout.read)
        conn.start(exchange, b"".join(request))
        try:
            await exchange.headers()
        except BaseException:
            exchange.abandon()
            conn.finish()
            conn.close()
            raise
        return Http1Response(exchange, self, key, conn)

    def _reusable(self, key: tuple[str, int], now: float) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the newest: the least likely to be near its expiry
            if not conn.closed and now - conn.idle_since < self._keepalive_expiry:
                return conn
            conn.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int], url: str,
                       connect_timeout: float | None) -> Connection:
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(lambda: Connection(loop), *key)
        except TimeoutError:
            raise timed_out(url, f"connecting took over {connect_timeout:g} s") from None
        except OSError as exc:
            raise refused(url, exc) from exc
        return conn

    def keep(self, key: tuple[str, int], conn: Connection) -> None:
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
