"""The relay's SSE framing and its in-band error event (what the openai client raises on)."""

from __future__ import annotations

import json

from proxy.errors import UpstreamError
from proxy.relay import SseFramer, error_event


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
