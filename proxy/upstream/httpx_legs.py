"""The legs over any httpx transport: the tests' `MockTransport`, or httpx's own pool.

Through httpx's public transport API only: a built `httpx.Request` (its timeouts in the
request's extensions, as `AsyncClient` sets them) handed to
`AsyncBaseTransport.handle_async_request`. `AsyncClient.send` would add nothing a leg uses
(auth flow, redirects, cookies, an INFO log line per request) at ~10% of the proxy's CPU
(benchmarks/proxy_overhead).

httpx's errors become the proxy's own here, once (`proxy.upstream.legs`): a ConnectError is
UpstreamRefused (the request was never sent), any TimeoutException (a connect timeout
included) UpstreamTimeout, every other httpx error UpstreamBroken - a ReadError, WriteError or
RemoteProtocolError may follow a request the node received in full. The message keeps httpx's
class name, which says which moment failed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx

from proxy.shared.errors import UpstreamError, UpstreamTimeout
from proxy.upstream.legs import KEEPALIVE_EXPIRY_S, LegTimeouts, broken, refused, timed_out

# Idle connections httpx's pool keeps (the other legs keep every idle one until it expires).
MAX_IDLE_CONNECTIONS = 256


def _upstream_error(exc: httpx.HTTPError, url: str) -> UpstreamError | UpstreamTimeout:
    if isinstance(exc, httpx.TimeoutException):
        return timed_out(url, type(exc).__name__)
    if isinstance(exc, httpx.ConnectError):
        return refused(url, exc)
    return broken(url, f"{type(exc).__name__}: {exc}")


class HttpxResponse:
    """An httpx response as a `proxy.upstream.legs.LegResponse`."""

    __slots__ = ("status", "content_type", "_response", "_url", "_chunks")

    def __init__(self, response: httpx.Response, url: str) -> None:
        self._response = response
        self._url = url
        self._chunks: AsyncIterator[bytes] | None = None
        self.status = response.status_code
        self.content_type: str = response.headers.get("content-type", "application/json")

    @property
    def at_end(self) -> bool:
        """Not known here (False): the relay then writes a stream's end on its own."""
        return False

    async def aread(self) -> bytes:
        """The whole body."""
        try:
            return await self._response.aread()
        except httpx.HTTPError as exc:
            raise _upstream_error(exc, self._url) from exc

    async def read_chunk(self) -> bytes:
        """The bytes that arrived since the last read, b"" at the end."""
        if self._chunks is None:
            self._chunks = self._response.aiter_bytes()
        try:
            return await anext(self._chunks, b"")
        except httpx.HTTPError as exc:
            raise _upstream_error(exc, self._url) from exc

    async def aclose(self) -> None:
        """Close the response (its stream's `aclose`: a mock node counts it as cancelled
        before the end)."""
        await self._response.aclose()


class HttpxLegs:
    """POSTs through one httpx transport, which these legs own (closed with them)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, timeout: LegTimeouts,
                 headers: Mapping[str, str] | None = None) -> None:
        self._transport = transport
        self._headers = dict(headers or {})
        # As AsyncClient passes a request's timeouts to its transport.
        self._timeouts = httpx.Timeout(timeout.read, connect=timeout.connect).as_dict()

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]
                   ) -> HttpxResponse:
        """POST content; the response once its headers arrived (`proxy.upstream.legs` errors)."""
        request = httpx.Request("POST", url, content=content,
                                headers={**self._headers, **headers},
                                extensions={"timeout": self._timeouts})
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise _upstream_error(exc, url) from exc
        response.request = request
        return HttpxResponse(response, url)

    async def aclose(self) -> None:
        """Close the transport."""
        await self._transport.aclose()


def httpx_pool() -> httpx.AsyncHTTPTransport:
    """httpx's own pool, idle connections dropped before vLLM's keep-alive closes them: the
    proxy's health probes, and the legs of the benchmark's `httpx` stack."""
    return httpx.AsyncHTTPTransport(limits=httpx.Limits(
        max_connections=None, max_keepalive_connections=MAX_IDLE_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_EXPIRY_S))
