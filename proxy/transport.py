"""The upstream transport: aiohttp's connection pool behind httpx's API.

The router and `proxy.forward` speak httpx (its `MockTransport` is the tests' seam), but
httpx's own pool (httpcore) scans every pooled connection on each request and was the proxy's
largest cost under concurrency (encode/httpx#3215; the benchmark in benchmarks/proxy_overhead
measured 20% of the proxy's CPU at 64 streams, 46% at 256). aiohttp's pool keeps idle
connections per host in a deque. This adapter sends httpx requests through an aiohttp session
and translates aiohttp's errors into the httpx ones `proxy.forward` already handles, by what
they mean for a retry: a refused connection is a ConnectError (the request was never sent),
everything after that a ReadError or RemoteProtocolError, timeouts by phase.

`AiohttpTransport.post` is the proxy's own legs' path (`proxy.forward`): the same session and
the same error translation, without building an httpx Request and Response per leg (~12% of
the proxy's CPU per request, benchmarks/proxy_overhead); it returns a `RawResponse`.

`LegTransport` (the default) is the same transport whose legs go through `proxy.http1`
instead: asyncio protocols with httptools' parser, no aiohttp client objects at all (aiohttp's
ClientSession was ~35% of the proxy's CPU on the P->D path after the change above). Other
httpx requests (health probes, /metrics scrapes) still use aiohttp.

`httpx_transport` is httpx's own pool with the same limits (the benchmark's BEFORE stack).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import httpx

from proxy.http1 import Http1Pool, Http1Response

# Idle connections are dropped before vLLM's 5 s keep-alive timeout closes them.
KEEPALIVE_EXPIRY_S = 2.0
MAX_IDLE_CONNECTIONS = 256


def _httpx_error(exc: BaseException) -> httpx.TransportError | None:
    """The httpx error an aiohttp failure means (None: not a transport failure)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientOSError):
        return httpx.ReadError(message)
    if isinstance(exc, aiohttp.ClientError):
        return httpx.TransportError(message)
    return None


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (TimeoutError, aiohttp.ClientError) as exc:
        translated = _httpx_error(exc)
        if translated is None:
            raise
        raise translated from exc


class _Body(httpx.AsyncByteStream):
    """An aiohttp response body, chunks passed on as they arrive."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _translated():
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        _release(self._response)


def _release(response: aiohttp.ClientResponse) -> None:
    # A body closed before its end closes the connection, so vLLM aborts the request;
    # a finished one goes back to the pool.
    if response.content.is_eof():
        response.release()
    else:
        response.close()


@functools.lru_cache(maxsize=16)
def _timeout(connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    # The app's few timeouts, built once (a ClientTimeout is immutable).
    return aiohttp.ClientTimeout(sock_connect=connect, sock_read=read)


class RawResponse:
    """An upstream response as the legs need it: status, content type, the body's bytes."""

    __slots__ = ("status", "content_type", "_response")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.content_type: str = response.headers.get("content-type", "application/json")

    async def aread(self) -> bytes:
        """The whole body (translated httpx errors if it breaks)."""
        with _translated():
            return await self._response.read()

    async def aiter(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (translated httpx errors if it breaks)."""
        while chunk := await self.read_chunk():
            yield chunk

    async def read_chunk(self) -> bytes:
        """The bytes that arrived since the last read, b"" at the end (translated errors)."""
        with _translated():
            return await self._response.content.readany()

    async def aclose(self) -> None:
        """Back to the pool when read to the end, else the connection is closed."""
        _release(self._response)


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx requests over one aiohttp session (opened on first use, in the serving loop)."""

    def __init__(self, keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive_expiry)
        # httpx decodes bodies and builds every header itself; aiohttp only moves bytes.
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              trust_env=False, timeout=aiohttp.ClientTimeout())
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session or self._open()
        timeout = request.extensions.get("timeout", {})
        with _translated():
            response = await session.request(
                request.method, str(request.url), headers=request.headers.multi_items(),
                data=await request.aread() or None, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(sock_connect=timeout.get("connect"),
                                              sock_read=timeout.get("read")))
        return httpx.Response(response.status, headers=response.raw_headers,
                              stream=_Body(response),
                              extensions={"http_version": b"HTTP/1.1",
                                          "reason_phrase": (response.reason or "").encode()})

    async def post(self, url: str, content: bytes, headers: dict[str, str],
                   timeout: httpx.Timeout) -> RawResponse:
        """POST content; the response once its headers arrived (translated httpx errors)."""
        session = self._session or self._open()
        with _translated():
            response = await session.post(url, data=content, headers=headers,
                                          allow_redirects=False,
                                          timeout=_timeout(timeout.connect, timeout.read))
        return RawResponse(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class LegTransport(AiohttpTransport):
    """AiohttpTransport whose legs (`post`, http:// URLs) use `proxy.http1`'s pool."""

    def __init__(self, keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        super().__init__(keepalive_expiry)
        self._legs = Http1Pool(keepalive_expiry)

    async def post(self, url: str, content: bytes, headers: dict[str, str],  # type: ignore[override]
                   timeout: httpx.Timeout) -> RawResponse | Http1Response:
        """POST content; the response once its headers arrived (translated httpx errors)."""
        if not url.startswith("http://"):
            return await super().post(url, content, headers, timeout)
        return await self._legs.post(url, content, headers, timeout)

    async def aclose(self) -> None:
        self._legs.close()
        await super().aclose()


def httpx_transport() -> httpx.AsyncHTTPTransport:
    """httpx's own pool, with the limits the aiohttp transport has."""
    return httpx.AsyncHTTPTransport(limits=httpx.Limits(
        max_connections=None, max_keepalive_connections=MAX_IDLE_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_EXPIRY_S))


def default_transport() -> httpx.AsyncBaseTransport:
    """The transport the proxy uses unless told otherwise."""
    return LegTransport()
