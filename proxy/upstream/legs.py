"""The transport seam: what `proxy.upstream.forward` sends its legs through, and what comes back.

    Legs.post(url, content, headers) -> LegResponse      one POST, answered once its head arrived
    Legs.aclose()                                        every connection closed

Three implementations, each built once with the legs' timeouts and the headers every leg
carries (the backend API key):
- `proxy.upstream.http1.Http1Pool`: asyncio protocols with httptools' parser (the default, for
  `http://` nodes; `proxy.upstream.transport.DefaultLegs` sends the rest through aiohttp);
- `proxy.upstream.aiohttp_legs.AiohttpLegs`: aiohttp's pool (`https://` nodes, a benchmark stack);
- `proxy.upstream.httpx_legs.HttpxLegs`: any httpx transport - the tests' `MockTransport`, httpx's
own
  pool - through httpx's public API.

Every implementation raises the proxy's own errors (`proxy.shared.errors`), translated once, at its
own boundary, by what the failure means for a retry (`proxy.upstream.forward`: nothing is sent
twice):
- `UpstreamRefused`: the connection could not be made - the request never left;
- `UpstreamTimeout`: connecting, or a read, waited longer than its timeout;
- `UpstreamBroken`: anything after the connection was made (closed before the answer's
  head, closed inside the body, garbage instead of HTTP): the node may have run the request.
`refused`, `timed_out` and `broken` below give each error its one message shape, whichever
implementation raises it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from proxy.shared.errors import UpstreamBroken, UpstreamRefused, UpstreamTimeout

# Idle connections are dropped before vLLM's 5 s keep-alive timeout closes them: a POST must
# never meet a connection the server is closing, since it cannot be resent.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass(frozen=True, slots=True)
class LegTimeouts:
    """Seconds a leg may wait to connect, and for each read (None: unbounded)."""

    connect: float | None
    read: float | None


class LegResponse(Protocol):
    """An upstream answer whose status and headers arrived; its body read once, in order."""

    status: int
    content_type: str

    @property
    def at_end(self) -> bool:
        """Every byte of the body was read and its end has arrived (False: not known yet,
        or not knowable on this implementation)."""
        ...

    async def aread(self) -> bytes:
        """The rest of the body, whole."""
        ...

    async def read_chunk(self) -> bytes:
        """The bytes that arrived since the last read; b"" at the body's end."""
        ...

    async def aclose(self) -> None:
        """Done with it: its connection is reused when the body was read to its end, else
        closed (vLLM aborts a request whose connection closes)."""
        ...


class Legs(Protocol):
    """POSTs to the nodes, each sent exactly once."""

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> LegResponse:
        """Send content with headers (besides the ones every leg carries); the answer once
        its status and headers arrived. Failures raise the errors above."""
        ...

    async def aclose(self) -> None:
        """Close every connection."""
        ...


# Every implementation's constructor: the legs' timeouts and the headers every leg carries in.
LegsFactory = Callable[[LegTimeouts, Mapping[str, str]], Legs]


def refused(url: str, detail: object) -> UpstreamRefused:
    """The connection to url could not be made."""
    return UpstreamRefused(f"cannot connect to backend {url}: {detail}")


def timed_out(url: str, what: str) -> UpstreamTimeout:
    """Connecting to url, or a read from it, took longer than its timeout."""
    return UpstreamTimeout(f"backend {url} timed out ({what})")


def broken(url: str, detail: str) -> UpstreamBroken:
    """The connection to url failed after it was made."""
    return UpstreamBroken(f"backend {url} failed: {detail}")
