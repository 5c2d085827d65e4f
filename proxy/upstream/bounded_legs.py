"""Node answers bounded in bytes: `BoundedLegs` wraps any `proxy.upstream.legs.Legs`.

A node's answer is read whole (non-streamed legs, a 4xx) or relayed chunk by chunk (streams).
Neither was bounded: a whole 200 MB answer crashed the proxy, and a stream that never ended an
event grew it 240 MB in 30 s (whatever parses the stream on the side keeps the unfinished
event). So:
- a whole answer over `--max-answer-bytes` is an `UpstreamTooLarge` (502 naming the flag),
  raised as soon as the count passes the limit, before the rest is read;
- a stream whose bytes since the last event boundary (a blank line) pass
  `--max-stream-event-bytes` is the same error: a 502 before the first byte reaches the
  client, an in-band error after (`proxy.upstream.relay`).
Each costs one length sum per chunk, and one search for a boundary in the chunk.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.shared.errors import UpstreamTooLarge
from proxy.shared.limits import Limits
from proxy.upstream.legs import LegResponse, Legs


class BoundedResponse:
    """A `LegResponse` whose whole body and each stream event are bounded in bytes."""

    __slots__ = ("_inner", "_url", "_limits", "_pending", "status", "content_type")

    def __init__(self, inner: LegResponse, url: str, limits: Limits) -> None:
        self._inner = inner
        self._url = url
        self._limits = limits
        self._pending = 0  # bytes since the last event boundary
        self.status = inner.status
        self.content_type = inner.content_type

    @property
    def at_end(self) -> bool:
        return self._inner.at_end

    async def aread(self) -> bytes:
        limit = self._limits.max_answer_bytes
        parts: list[bytes] = []
        size = 0
        while chunk := await self._inner.read_chunk():
            size += len(chunk)
            if size > limit:
                raise UpstreamTooLarge(f"backend {self._url} answered over {limit} bytes "
                                       "(--max-answer-bytes)")
            parts.append(chunk)
        return b"".join(parts)

    @property
    def inner(self) -> LegResponse:
        """The response this one bounds (`proxy.upstream.forward.UpstreamStream` reads a stream from
        it directly and calls `check_event` per chunk: one coroutine layer less a chunk)."""
        return self._inner

    async def read_chunk(self) -> bytes:
        chunk = await self._inner.read_chunk()
        self.check_event(chunk)
        return chunk

    def check_event(self, chunk: bytes) -> None:
        """Count a stream chunk's bytes since the last event boundary; UpstreamTooLarge past
        --max-stream-event-bytes."""
        if chunk.endswith(b"\n\n"):  # vLLM writes whole events: nothing pending
            self._pending = 0
            return
        end = chunk.rfind(b"\n\n")  # the other boundaries only when this one is not there
        if end < 0:
            end = max(chunk.rfind(b"\r\n\r\n"), chunk.rfind(b"\r\r"))
        self._pending = self._pending + len(chunk) if end < 0 else len(chunk) - end
        if self._pending > self._limits.max_stream_event_bytes:
            raise UpstreamTooLarge(
                f"backend {self._url} sent a stream event over "
                f"{self._limits.max_stream_event_bytes} bytes (--max-stream-event-bytes)")

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedLegs:
    """Legs whose answers are bounded (`Limits.max_answer_bytes`, `max_stream_event_bytes`)."""

    def __init__(self, inner: Legs, limits: Limits) -> None:
        self.inner = inner
        self._limits = limits

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> LegResponse:
        return BoundedResponse(await self.inner.post(url, content, headers), url, self._limits)

    async def aclose(self) -> None:
        await self.inner.aclose()
