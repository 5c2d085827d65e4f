"""A streamed reply's body: upstream SSE events passed through, parsed on the side, ended once.

Bytes go out unchanged, but only in whole SSE events (vLLM writes one event per chunk, so
nothing waits in practice): if the upstream fails after the client got its 200, the relay can
then end the stream with one well-formed in-band error event, `data: {"error": {...}}`, and no
`[DONE]` - the `openai` client raises an APIError on it instead of returning a cut reply as
if it were whole. A failure after `[DONE]` changes nothing: the reply is complete.

`StreamLimits` bound a stream: the request's deadline (`--request-timeout` bounds the whole
request, stream included; the budget running out is not the node's fault) and max_tokens (a D
that streams more events carrying tokens than the request's max_tokens is a runaway: cut, and
charged to the node). Either ends the stream with the in-band error event.

The relay owns the request's lease from the moment the router hands it over: a clean end
settles D's slot as a success, a failure as D's failure (the router's `on_failure`), and the
close, early or not (Quart closes the body when the client disconnects, which closes the
upstream response so vLLM aborts the request), releases whatever is still held.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proxy.shared.completion import SSE_EVENT_ENDS, Captured, ReplyCapture
from proxy.shared.errors import (
    BudgetExhausted,
    ProxyError,
    UpstreamRunaway,
)
from proxy.upstream.backends import Backend
from proxy.upstream.deadline import Deadline, DeadlineExceeded, guarded
from proxy.upstream.forward import UpstreamStream
from proxy.upstream.lease import Lease

log = logging.getLogger("ppd.proxy")


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What bounds a stream: the request's deadline (None: none; the relay closes it), the
    message for when it expires, and the request's max_tokens (None: no cap)."""

    deadline: Deadline | None = None
    over_budget: str = "the request timed out"
    max_tokens: int | None = None


def error_event(exc: ProxyError) -> bytes:
    """The in-band SSE error event for a failure after the response started."""
    return b"data: " + exc.body_bytes() + b"\n\n"


class SseFramer:
    """Cuts a byte stream after its last complete SSE event; the rest waits for more bytes."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events the bytes so far end with (possibly none)."""
        if not self._pending and chunk.endswith(b"\n\n"):
            return chunk  # vLLM writes whole events: nothing to cut, nothing to keep
        data = self._pending + chunk
        end = max((data.rfind(sep) + len(sep) for sep in SSE_EVENT_ENDS if sep in data), default=0)
        self._pending = data[end:]
        return data[:end]

    def flush(self) -> bytes:
        """What is left once the upstream ended cleanly (sent as is)."""
        rest, self._pending = self._pending, b""
        return rest


def _split_before_done(events: bytes) -> tuple[bytes, bytes]:
    """Complete events cut at the start of the line holding `[DONE]` (b"" if none).

    A `[DONE]` inside a reply's text cuts earlier than needed, which only holds some bytes
    back until the capture has read them; the bytes sent are the same either way."""
    at = events.find(b"[DONE]")
    if at < 0:
        return events, b""
    line_start = max(events.rfind(b"\n", 0, at), events.rfind(b"\r", 0, at)) + 1
    return events[:line_start], events[line_start:]


class Relay:
    """The body of a streamed reply; iterate it, and `aclose()` it if you stop early."""

    def __init__(self, stream: UpstreamStream, node: Backend, lease: Lease,
                 capture: ReplyCapture,
                 on_reply: Callable[[Captured], Awaitable[None] | None],
                 on_failure: Callable[[ProxyError], None],
                 on_close: Callable[[], None] | None = None,
                 limits: StreamLimits = StreamLimits(), record_late: bool = False) -> None:
        """`record_late`: see the attribute."""
        self._stream = stream
        self._limits = limits
        self._node = node
        self._lease = lease
        self._capture = capture
        self._on_reply = on_reply
        self._on_failure = on_failure
        self._on_close = on_close  # once, last (the access log line)
        # The turn may be recorded when the relay closes, after the reply's last bytes went
        # out (rather than before `[DONE]` is released): the client gets its end sooner (the
        # capture's parse and the record leave the path to it, ~10% of a turn at concurrency
        # 1, benchmarks/proxy_overhead). Only where nothing can be read in between: the
        # router allows it for a store in this process (its record never yields to the event
        # loop), and the caller keeps it only if it writes the last chunk and closes the relay
        # without yielding either (`proxy.serving.endpoints` on the proxy's own server): then
        # no request - the client's next turn included - is read before the turn is recorded.
        self.record_late = record_late
        self._late = False  # the reply's end went out; it is recorded at the close
        self._framer = SseFramer()
        self._done_next: bytes = b""  # a `[DONE]` held back until the turn is recorded
        self._ended = False  # the upstream's part is over; what is held is the last
        self._closed = False
        self._replied = False
        self._sent = False  # a chunk has gone to the client
        # The chunk just returned was the body's last (the upstream had ended with it): the
        # server can write it with the body's end.
        self.finished = False

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> bytes:
        # A plain method, not an async generator: every chunk of every stream comes through
        # here, and the generator's resumption was one more layer per chunk.
        if not self._closed and (not self._ended or self._done_next):
            try:
                chunk = await self._next()
                self._sent = True
                return chunk
            except BaseException:
                await self.aclose()
                raise
        await self.aclose()
        raise StopAsyncIteration

    async def _next(self) -> bytes:
        """The next bytes for the client; sets `_ended` at the upstream's end."""
        capture, deadline = self._capture, self._limits.deadline
        try:
            if self._done_next:
                done, self._done_next = self._done_next, b""
                if self.record_late and self._stream.at_end:
                    return self._end_late(done)
                if capture.stream_done:
                    await self._reply_once()
                    return self._finish_with(done)
                return done
            while True:
                # Each read waits under the request's deadline (`proxy.upstream.deadline`: one
                # timer for the whole stream, guarding only the reads, never the writes to the
                # client).
                try:
                    with guarded(deadline):
                        chunk = await self._stream.next_chunk()
                except DeadlineExceeded:
                    raise BudgetExhausted(self._limits.over_budget) from None
                if not chunk:
                    self._ended = True
                    rest = self._framer.flush()
                    self._lease.settle(self._node, ok=True)
                    await self._reply_once()
                    if rest:
                        return rest
                    raise StopAsyncIteration
                # The client gets the bytes before the capture parses them (the first token is
                # not delayed by reading the rest of a chunk), except `[DONE]`: the turn is
                # recorded before the client can read it, so a client that sends its next turn
                # at once finds the session already holding this reply. A later chunk that
                # ends with `[DONE]` goes out whole once recorded (its events are the reply's
                # last: the client's reply ends no later).
                head, done = _split_before_done(self._framer.feed(chunk))
                capture.feed(chunk)
                limit = self._limits.max_tokens
                if limit is not None and not done and capture.could_exceed(limit):
                    raise UpstreamRunaway(f"backend {self._node.url} streamed past the request's "
                                        f"max_tokens ({limit}); reply cut")
                if done and self.record_late and self._sent and self._stream.at_end:
                    return self._end_late(head + done)
                if done:
                    # The complete events hold "[DONE]" (maybe only inside a reply's text: the
                    # capture says whether the stream's own `[DONE]` event came).
                    if head and self._sent and capture.stream_done:
                        # The reply's last events after its first bytes went out: recorded,
                        # then sent with `[DONE]` in one write (a client waits for `[DONE]`
                        # anyway; one write and one wake-up of the client fewer a reply).
                        await self._reply_once()
                        return head + self._finish_with(done)
                    if head:
                        self._done_next = done
                        return head
                    if capture.stream_done:
                        await self._reply_once()
                        return self._finish_with(done)
                    return done
                if head:
                    return head
        except ProxyError as exc:
            self._ended = True
            if capture.stream_done:
                self._lease.settle(self._node, ok=True)
                raise StopAsyncIteration from None
            self._on_failure(exc)
            return error_event(exc)

    def _end_late(self, last: bytes) -> bytes:
        """The reply's last bytes (`[DONE]` among them) with the upstream's end: all of it goes
        out now, and the capture reads it when the relay closes (`record_late`)."""
        self._late = True
        return self._finish_with(last)

    def _finish_with(self, done: bytes) -> bytes:
        """`[DONE]` (the turn recorded, or recorded at the close), and when the upstream's end
        has arrived too, what the framer still holds: then the stream is over here, as when
        its end is read."""
        if not self._stream.at_end:
            return done
        self._ended = self.finished = True
        self._lease.settle(self._node, ok=True)
        return done + self._framer.flush()

    async def _reply_once(self) -> None:
        if not self._replied:
            self._replied = True
            # A shared session store records over the network: the client reads `[DONE]`
            # only once the write is done.
            done = self._on_reply(self._capture.finish())
            if inspect.isawaitable(done):
                await done

    async def aclose(self) -> None:
        """Stop: close the upstream response and release the lease (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._late:
                await self._reply_once()
        except Exception as exc:  # a bug: the client has its reply; the turn stays unrecorded
            log.exception("recording the turn failed: %s", exc)
        try:
            await self._stream.aclose()
        finally:
            self._lease.release()
            if self._limits.deadline is not None:
                self._limits.deadline.close()
            if self._on_close is not None:
                self._on_close()
