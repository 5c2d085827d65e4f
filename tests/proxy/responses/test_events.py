"""The stream's events: OpenAI's types, in order, numbered, items closed at the end."""

from __future__ import annotations

import json

from proxy.responses.events import EventWriter
from proxy.responses.items import ResponseRequest


def _events(data: bytes) -> list[dict]:
    out = []
    for block in data.split(b"\n\n"):
        if block:
            kind, payload = block.split(b"\n")
            event = json.loads(payload[len(b"data: "):])
            assert kind == b"event: " + event["type"].encode()
            out.append(event)
    return out


def test_text_then_a_tool_call_then_the_end() -> None:
    writer = EventWriter("resp_1", ResponseRequest.parse({"model": "m", "input": "x"}), 5)
    data = writer.opening()
    data += writer.feed({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    data += writer.feed({"choices": [{"index": 0, "delta": {"content": "lo"}}]})
    data += writer.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{\"a\""}}]}}]})
    data += writer.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "length"}]})
    data += writer.feed({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    tail, response = writer.closing()
    events = _events(data + tail + writer.final(response))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.incomplete"]
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert final["output"][1]["arguments"] == "{\"a\": 1}"
    assert final["output"][1]["call_id"] == "call_1"
    assert final["usage"]["input_tokens"] == 3 and final["usage"]["total_tokens"] == 7
    assert events[6]["output_index"] == 1 and events[2]["output_index"] == 0


def test_a_failure_mid_stream_is_response_failed() -> None:
    writer = EventWriter("resp_1", ResponseRequest.parse({"model": "m", "input": "x"}), 5)
    [event] = _events(writer.failed("D broke"))
    assert event["type"] == "response.failed"
    assert event["response"]["error"] == {"code": "server_error", "message": "D broke"}
