"""How the completion endpoints answer, whichever server carries the response.

A `Responder` sends one response: `whole` (a body at hand: its length is known), or `head`
then `chunk`s (a stream; the head goes out with the first chunk where the responder can).
Two kinds:
- `AsgiResponder` sends ASGI messages: any ASGI server (hypercorn, granian, a test's ASGI
  client) and every request uvicorn serves through the app's ASGI callable;
- `proxy.serving.direct.DirectResponder` writes the bytes on uvicorn's connection itself: the
  completion POSTs the proxy's own server hands the app directly (`DirectApp`), without an
  ASGI message dict, a coroutine and a regex per header line on every write.

Headers are (name, value) byte pairs, names lower-case; neither kind adds the framing ones
(content-length, transfer-encoding) the caller did not give, but both let the server do it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol, runtime_checkable

Headers = list[tuple[bytes, bytes]]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Responder(Protocol):
    @property
    def writes_at_once(self) -> bool:
        """Whether a write hands the bytes to the connection without yielding to the event
        loop (`proxy.upstream.relay.Relay.record_late` depends on it)."""

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        """The response, complete (content-length is added)."""

    async def head(self, status: int, headers: Headers) -> None:
        """A streamed response's status and headers (written with its first chunk)."""

    async def chunk(self, data: bytes, more: bool) -> None:
        """The stream's next bytes; more=False ends the response."""


# Serves one request: its scope, the server's receive (the body, then a disconnect), and
# where the answer goes.
DirectHandler = Callable[[Scope, Receive, Responder], Awaitable[None]]


@runtime_checkable
class DirectApp(Protocol):
    """An ASGI app that serves some requests directly: `direct(scope)` is the handler for a
    request whose headers were read (None: the request goes through the ASGI callable).
    The server asks before it starts the request's task."""

    def direct(self, scope: Scope) -> DirectHandler | None: ...


class AsgiResponder:
    """A `Responder` over an ASGI `send`."""

    __slots__ = ("_send",)
    writes_at_once = False  # an ASGI server's send may wait

    def __init__(self, send: Send) -> None:
        self._send = send

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        headers = [*headers, (b"content-length", b"%d" % len(body))]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def head(self, status: int, headers: Headers) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, data: bytes, more: bool) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})


class HeadSeen:
    """A `Responder` that notes the status and x-ppd-* headers the response started with
    (the turn's trace records them), passing everything on."""

    __slots__ = ("_inner", "status", "headers")

    def __init__(self, inner: Responder) -> None:
        self._inner = inner
        self.status = 499  # nothing sent: the client left first (nginx's code for it)
        self.headers: dict[str, str] = {}

    @property
    def writes_at_once(self) -> bool:
        return self._inner.writes_at_once

    def _note(self, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = {name.decode("latin-1"): value.decode("latin-1")
                        for name, value in headers if name.startswith(b"x-ppd-")}

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        self._note(status, headers)
        await self._inner.whole(status, headers, body)

    async def head(self, status: int, headers: Headers) -> None:
        self._note(status, headers)
        await self._inner.head(status, headers)

    async def chunk(self, data: bytes, more: bool) -> None:
        await self._inner.chunk(data, more)
