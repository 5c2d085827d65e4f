"""The legs over aiohttp's connection pool: `https://` nodes, and a benchmark stack.

httpx's own pool (httpcore) scans every pooled connection on each request and was the proxy's
largest cost under concurrency (encode/httpx#3215; benchmarks/proxy_overhead measured 20% of
the proxy's CPU at 64 streams, 46% at 256); aiohttp's keeps idle connections per host in a
deque. `proxy.upstream.http1` has since replaced it for `http://` nodes (aiohttp's ClientSession was
~35% of the proxy's CPU on the P->D path); TLS stays here.

aiohttp's failures become the proxy's own errors here, once, by what they mean for a retry
(`proxy.upstream.legs`): a connection that could not be made is UpstreamRefused (the request was
never
sent), a connect or read timeout UpstreamTimeout, anything after the connection was made
UpstreamBroken.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import aiohttp

from proxy.shared.errors import UpstreamError, UpstreamTimeout
from proxy.upstream.legs import KEEPALIVE_EXPIRY_S, LegTimeouts, broken, refused, timed_out


def _upstream_error(exc: BaseException, url: str) -> UpstreamError | UpstreamTimeout | None:
    """The proxy error an aiohttp failure means (None: not a transport failure)."""
    name = type(exc).__name__
    message = str(exc) or name
    # Order matters: a connect timeout is a ServerTimeoutError and a TimeoutError, a
    # connector error a ClientOSError.
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return timed_out(url, f"connecting: {message}")
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return timed_out(url, f"reading: {message}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return refused(url, message)
    if isinstance(exc, aiohttp.ClientError):
        return broken(url, f"{name}: {message}")
    return None


@contextmanager
def _translated(url: str) -> Iterator[None]:
    try:
        yield
    except (TimeoutError, aiohttp.ClientError) as exc:
        translated = _upstream_error(exc, url)
        if translated is None:
            raise
        raise translated from exc


@functools.lru_cache(maxsize=16)
def _timeout(connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    # The app's few timeouts, built once (a ClientTimeout is immutable).
    return aiohttp.ClientTimeout(sock_connect=connect, sock_read=read)


class AiohttpResponse:
    """An aiohttp response as a `proxy.upstream.legs.LegResponse`."""

    __slots__ = ("status", "content_type", "_response", "_url")

    def __init__(self, response: aiohttp.ClientResponse, url: str) -> None:
        self._response = response
        self._url = url
        self.status = response.status
        self.content_type: str = response.headers.get("content-type", "application/json")

    @property
    def at_end(self) -> bool:
        """Not known here (False): the relay then writes a stream's end on its own."""
        return False

    async def aread(self) -> bytes:
        """The whole body."""
        with _translated(self._url):
            return await self._response.read()

    async def read_chunk(self) -> bytes:
        """The bytes that arrived since the last read, b"" at the end."""
        with _translated(self._url):
            return await self._response.content.readany()

    async def aclose(self) -> None:
        """Back to the pool when read to the end, else the connection is closed (so vLLM
        aborts the request)."""
        response = self._response
        if response.content.is_eof():
            response.release()
        else:
            response.close()


class AiohttpLegs:
    """POSTs over one aiohttp session (opened on first use, in the serving loop)."""

    def __init__(self, timeout: LegTimeouts, headers: Mapping[str, str] | None = None,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._timeout = _timeout(timeout.connect, timeout.read)
        self._headers = dict(headers or {})
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive_expiry)
        # The legs build every header themselves and pass bodies through undecoded.
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              trust_env=False, timeout=aiohttp.ClientTimeout())
        return self._session

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]
                   ) -> AiohttpResponse:
        """POST content; the response once its headers arrived (`proxy.upstream.legs` errors)."""
        session = self._session or self._open()
        with _translated(url):
            response = await session.post(url, data=content,
                                          headers={**self._headers, **headers},
                                          allow_redirects=False, timeout=self._timeout)
        return AiohttpResponse(response, url)

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None
