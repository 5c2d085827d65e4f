"""The HTTP legs to vLLM, and the only place httpx errors are translated.

- `prefill`: the P leg, a non-streamed POST; returns P's kv_transfer_params (or None).
- `open_stream`: a D, local or replica leg. It returns once the first body chunk has arrived,
  so every failure that can still be hidden from the client (refused, reset, 5xx, a read
  error before any byte) surfaces as an exception the router can fail over on.
- `UpstreamStream.chunks()` then passes the bytes through unchanged while `ReplyCapture`
  parses them on the side for the reply text and usage the session ledger needs.
Upstream 4xx answers are returned to the client as they are (UpstreamRejected).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.errors import UpstreamError, UpstreamRejected, UpstreamTimeout
from proxy.validate import Endpoint

# How much of a failing upstream's body to quote in the error message.
_ERROR_SNIPPET = 200
# Errors of a request that got no response at all: most often a pooled keep-alive connection
# the server closed just as it was reused (vLLM closes idle ones after 5 s). Sent once more,
# on a fresh connection, before the node is blamed.
_STALE_CONNECTION_ERRORS = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any], request_id: str, *,
                stream: bool) -> httpx.Response:
    """POST one leg; transport errors come back translated into the proxy's hierarchy."""
    request = client.build_request("POST", url, json=body, headers={"X-Request-Id": request_id})
    try:
        try:
            return await client.send(request, stream=stream)
        except _STALE_CONNECTION_ERRORS:
            return await client.send(request, stream=stream)
    except httpx.HTTPError as exc:
        raise _translate(exc, url) from exc


def _translate(exc: httpx.HTTPError, url: str) -> UpstreamError | UpstreamTimeout:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"backend {url} timed out", kind="timeout")
    if isinstance(exc, httpx.ConnectError):
        return UpstreamError(f"cannot connect to backend {url}: {exc}", kind="connect")
    return UpstreamError(f"backend {url} failed: {type(exc).__name__}: {exc}", kind="transport")


def _status_error(status: int, body: bytes, url: str, content_type: str) -> UpstreamError:
    if status >= 500:
        snippet = body[:_ERROR_SNIPPET].decode(errors="replace")
        return UpstreamError(f"backend {url} answered {status}: {snippet}", kind="status")
    return UpstreamRejected(status, body, content_type)


async def prefill(client: httpx.AsyncClient, base_url: str, endpoint: Endpoint,
                  body: dict[str, Any], request_id: str) -> Any:
    """Run the P leg; P's kv_transfer_params (None when P returned none)."""
    url = base_url + endpoint.value
    response = await _post(client, url, body, request_id, stream=False)
    if response.status_code >= 400:
        raise _status_error(response.status_code, response.content, url,
                            response.headers.get("content-type", "application/json"))
    try:
        data = response.json()
    except ValueError as exc:
        raise UpstreamError(f"backend {url} answered non-JSON to the prefill",
                            kind="protocol") from exc
    return data.get("kv_transfer_params") if isinstance(data, dict) else None


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose status, headers and first chunk have arrived."""

    response: httpx.Response
    first: bytes
    _rest: AsyncIterator[bytes]
    url: str

    @property
    def status(self) -> int:
        """The upstream status (2xx here)."""
        return self.response.status_code

    @property
    def content_type(self) -> str:
        """The upstream content type."""
        return self.response.headers.get("content-type", "application/json")

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body, first chunk included; mid-stream failures raise UpstreamError."""
        if self.first:
            yield self.first
        try:
            async for chunk in self._rest:
                yield chunk
        except httpx.HTTPError as exc:
            raise _translate(exc, self.url) from exc

    async def aclose(self) -> None:
        """Close the upstream response (vLLM aborts a request whose connection closes)."""
        await self.response.aclose()


async def open_stream(client: httpx.AsyncClient, base_url: str, endpoint: Endpoint,
                      body: dict[str, Any], request_id: str) -> UpstreamStream:
    """POST body and wait for the first chunk; errors before it raise, nothing is sent yet."""
    url = base_url + endpoint.value
    response = await _post(client, url, body, request_id, stream=True)
    try:
        if response.status_code >= 400:
            content = await response.aread()
            raise _status_error(response.status_code, content, url,
                                response.headers.get("content-type", "application/json"))
        rest = response.aiter_bytes()
        try:
            first = await anext(rest)
        except StopAsyncIteration:
            first = b""
    except httpx.HTTPError as exc:
        await response.aclose()
        raise _translate(exc, url) from exc
    except BaseException:
        await response.aclose()
        raise
    return UpstreamStream(response, first, rest, url)


@dataclass(frozen=True, slots=True)
class Captured:
    """What a finished response told us: reply text, usage, and whether it completed."""

    text: str
    usage: dict[str, Any] | None
    complete: bool


class ReplyCapture:
    """Parses a passthrough body on the side: SSE events when streamed, else one JSON."""

    def __init__(self, endpoint: Endpoint, stream: bool) -> None:
        self._chat = endpoint is Endpoint.CHAT
        self._stream = stream
        self._buffer = bytearray()
        self._parts: list[str] = []
        self._usage: dict[str, Any] | None = None
        self._done = False
        self._failed = False

    def feed(self, chunk: bytes) -> None:
        """Take the next body bytes."""
        self._buffer += chunk
        if not self._stream:
            return
        while True:
            end, size = self._event_end()
            if end < 0:
                return
            event = bytes(self._buffer[:end])
            del self._buffer[: end + size]
            self._event(event)

    def _event_end(self) -> tuple[int, int]:
        candidates = [(i, len(sep)) for sep in (b"\r\n\r\n", b"\n\n")
                      if (i := self._buffer.find(sep)) >= 0]
        return min(candidates) if candidates else (-1, 0)

    def _event(self, event: bytes) -> None:
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self._done = True
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                self._failed = True
                continue
            self._payload(payload, delta=True)

    def _payload(self, payload: Any, delta: bool) -> None:
        if not isinstance(payload, dict) or "error" in payload:
            self._failed = True
            return
        if isinstance(payload.get("usage"), dict):
            self._usage = payload["usage"]
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if self._chat:
                message = choice.get("delta" if delta else "message") or {}
                text = message.get("content") if isinstance(message, dict) else None
            else:
                text = choice.get("text")
            if isinstance(text, str):
                self._parts.append(text)
            if not delta and choice.get("finish_reason") is not None:
                self._done = True

    @property
    def stream_done(self) -> bool:
        """A streamed reply has sent `[DONE]`: everything the session needs has arrived."""
        return self._stream and self._done

    def finish(self) -> Captured:
        """The reply once the body ended (complete=False when it was cut or malformed)."""
        if not self._stream:
            try:
                self._payload(json.loads(self._buffer), delta=False)
            except ValueError:
                self._failed = True
        return Captured("".join(self._parts), self._usage, self._done and not self._failed)
