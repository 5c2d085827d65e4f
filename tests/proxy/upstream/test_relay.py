"""The relay's SSE framing and its in-band error event (what the openai client raises on)."""

from __future__ import annotations

import json

from proxy.shared.completion import Captured, ReplyCapture
from proxy.shared.errors import UpstreamError
from proxy.upstream.relay import Relay, SseFramer, _split_before_done, error_event


def test_framer_passes_whole_events_and_holds_a_partial_one() -> None:
    framer = SseFramer()
    assert framer.feed(b'data: {"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert framer.feed(b": 2}\n") == b""
    assert framer.feed(b"\ndata: [DONE]\n\n") == b'data: {"b": 2}\n\ndata: [DONE]\n\n'
    assert framer.feed(b"data: x\r\n\r\ntail") == b"data: x\r\n\r\n"
    assert framer.flush() == b"tail" and framer.flush() == b""


def test_error_event_is_one_openai_shaped_sse_event() -> None:
    event = error_event(UpstreamError("backend died"))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:]) == {"error": {"message": "backend died",
                                               "type": "upstream_error", "param": None,
                                               "code": "bad_gateway"}}


def test_done_is_cut_off_at_the_start_of_its_line() -> None:
    events = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    assert _split_before_done(events) == (b'data: {"a": 1}\n\n', b"data: [DONE]\n\n")
    assert _split_before_done(b'data: {"a": 1}\n\n') == (b'data: {"a": 1}\n\n', b"")
    assert _split_before_done(b"data: [DONE]\r\n\r\n") == (b"", b"data: [DONE]\r\n\r\n")
    # "[DONE]" in a reply's text cuts early: the same bytes, more of them held back.
    text = b'data: {"t": "[DONE]"}\n\ndata: [DONE]\n\n'
    assert b"".join(_split_before_done(text)) == text


class _Stream:
    """An upstream stream that arrived as one chunk (a fast D: the whole reply at once)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def next_chunk(self) -> bytes:
        body, self.body = self.body, b""
        return body

    @property
    def at_end(self) -> bool:
        return not self.body

    async def aclose(self) -> None:
        pass


class _Lease:
    def settle(self, node: object, ok: bool) -> None:
        pass

    def release(self) -> None:
        pass


async def test_the_client_gets_the_reply_before_it_is_parsed_and_done_after_it_is_recorded(
        ) -> None:
    reply = (b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
             b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n')
    body = reply + b"data: [DONE]\n\n"
    seen: list[object] = []

    def on_reply(captured: Captured) -> None:
        seen.append(captured)

    relay = Relay(_Stream(body), None, _Lease(), ReplyCapture(stream=True),  # type: ignore[arg-type]
                  on_reply, lambda exc: None)
    async for piece in relay:
        seen.append(piece)
    assert seen[0] == reply  # the tokens went out first
    assert isinstance(seen[1], Captured) and seen[1].text == "Hi" and seen[1].complete
    assert seen[2:] == [b"data: [DONE]\n\n"]  # [DONE] only once the turn was recorded


class _Chunks:
    """An upstream stream of given chunks whose end arrives with the last one (`ends_with`)
    or only on the read after it."""

    def __init__(self, chunks: list[bytes], ends_with_last: bool) -> None:
        self.chunks = list(chunks)
        self.ends_with_last = ends_with_last

    async def next_chunk(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    @property
    def at_end(self) -> bool:
        return self.ends_with_last and not self.chunks

    async def aclose(self) -> None:
        pass


class _CountingLease(_Lease):
    def __init__(self) -> None:
        self.settled: list[bool] = []

    def settle(self, node: object, ok: bool) -> None:
        self.settled.append(ok)


async def _relayed(stream: _Chunks) -> tuple[list[tuple[bytes, bool]], list[bool]]:
    lease = _CountingLease()
    relay = Relay(stream, None, lease, ReplyCapture(stream=True),  # type: ignore[arg-type]
                  lambda captured: None, lambda exc: None)
    return [(piece, relay.finished) async for piece in relay], lease.settled


async def test_done_that_arrives_with_the_upstreams_end_is_the_last_chunk() -> None:
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    # What follows [DONE] is the framer's (an unterminated comment): it goes out with it.
    pieces, settled = await _relayed(_Chunks([event, b"data: [DONE]\n\n: end"], True))
    assert pieces == [(event, False), (b"data: [DONE]\n\n: end", True)]
    assert settled == [True]


async def test_done_before_the_upstreams_end_is_not_the_last_chunk() -> None:
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    pieces, settled = await _relayed(_Chunks([event + b"data: [DONE]\n\n"], False))
    assert pieces == [(event, False), (b"data: [DONE]\n\n", False)]
    assert settled == [True]  # settled once, at the end read afterwards


async def _sent_by_stream(ends_with_last: bool) -> list[tuple[bytes, bool]]:
    from proxy.serving.endpoints import _stream
    from proxy.serving.responders import AsgiResponder

    event = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    relay = Relay(_Chunks([event, b"data: [DONE]\n\n"], ends_with_last), None,  # type: ignore[arg-type]
                  _CountingLease(), ReplyCapture(stream=True), lambda captured: None,  # type: ignore[arg-type]
                  lambda exc: None)
    sent: list[tuple[bytes, bool]] = []

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            sent.append((message["body"], message["more_body"]))  # type: ignore[arg-type]

    await _stream(200, [], relay, AsgiResponder(send))  # type: ignore[arg-type]
    return sent


async def test_the_last_chunk_carries_the_body_end_when_the_upstream_ended_with_it() -> None:
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    assert await _sent_by_stream(True) == [(event, True), (b"data: [DONE]\n\n", False)]
    # The upstream's end arrives after [DONE]: the body's end is a message of its own.
    assert await _sent_by_stream(False) == [(event, True), (b"data: [DONE]\n\n", True),
                                            (b"", False)]


async def test_the_last_events_go_out_with_done_once_recorded_after_the_first_chunk() -> None:
    first = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    last = b'data: {"choices": [{"index": 0, "delta": {"content": " there"}}]}\n\n'
    seen: list[object] = []
    relay = Relay(_Chunks([first, last + b"data: [DONE]\n\n"], True), None,  # type: ignore[arg-type]
                  _CountingLease(), ReplyCapture(stream=True),  # type: ignore[arg-type]
                  seen.append, lambda exc: None)
    async for piece in relay:
        seen.append((piece, relay.finished))
    # The first chunk at once; the last events and [DONE] in one piece, after the turn was
    # recorded (one write fewer), and the body's last.
    assert seen[0] == (first, False)
    assert isinstance(seen[1], Captured) and seen[1].text == "Hi there" and seen[1].complete
    assert seen[2:] == [(last + b"data: [DONE]\n\n", True)]


async def test_a_late_record_sends_the_end_first_and_records_when_the_relay_closes() -> None:
    first = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    last = b'data: {"choices": [{"index": 0, "delta": {"content": " there"}}]}\n\n'
    seen: list[object] = []
    lease = _CountingLease()
    relay = Relay(_Chunks([first, last + b"data: [DONE]\n\n"], True), None,  # type: ignore[arg-type]
                  lease, ReplyCapture(stream=True), seen.append,  # type: ignore[arg-type]
                  lambda exc: None, record_late=True)
    async for piece in relay:
        seen.append((piece, relay.finished))
        if relay.finished:
            break  # as the server does: the last chunk written, then the relay closed
    assert seen == [(first, False), (last + b"data: [DONE]\n\n", True)]  # nothing recorded yet
    assert lease.settled == [True]
    await relay.aclose()
    assert isinstance(seen[2], Captured) and seen[2].text == "Hi there" and seen[2].complete
    await relay.aclose()
    assert len(seen) == 3  # recorded once


async def test_a_late_record_waits_for_the_upstreams_end_and_never_records_a_cut_reply(
        ) -> None:
    first = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    done = b"data: [DONE]\n\n"
    # The upstream's end comes after [DONE]: recorded before [DONE] goes out, as without it.
    seen: list[object] = []
    relay = Relay(_Chunks([first, done], False), None, _CountingLease(),  # type: ignore[arg-type]
                  ReplyCapture(stream=True), seen.append, lambda exc: None,  # type: ignore[arg-type]
                  record_late=True)
    async for piece in relay:
        seen.append(piece)
    assert seen[0] == first and isinstance(seen[1], Captured) and seen[2:] == [done]
    # A client gone before the end: closed early, nothing recorded.
    recorded: list[Captured] = []
    relay = Relay(_Chunks([first, done], True), None, _CountingLease(),  # type: ignore[arg-type]
                  ReplyCapture(stream=True), recorded.append, lambda exc: None,  # type: ignore[arg-type]
                  record_late=True)
    assert await relay.__anext__() == first
    await relay.aclose()
    assert recorded == []


async def test_a_late_record_of_a_reply_that_arrived_whole_still_sends_its_tokens_first(
        ) -> None:
    reply = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    seen: list[object] = []
    relay = Relay(_Stream(reply + b"data: [DONE]\n\n"), None, _Lease(),  # type: ignore[arg-type]
                  ReplyCapture(stream=True), seen.append, lambda exc: None,  # type: ignore[arg-type]
                  record_late=True)
    async for piece in relay:
        seen.append((piece, relay.finished))
        if relay.finished:
            break
    # The tokens first (the first write), then [DONE] as the body's last, unrecorded yet.
    assert seen == [(reply, False), (b"data: [DONE]\n\n", True)]
    await relay.aclose()
    assert isinstance(seen[2], Captured) and seen[2].text == "Hi" and seen[2].complete
