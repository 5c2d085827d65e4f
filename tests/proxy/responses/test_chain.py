"""A chain's items as the chat request the nodes get: the history rule, tools, instructions."""

from __future__ import annotations

import pytest

from proxy.responses.chain import chat_body, item_messages
from proxy.responses.items import ResponseRequest, normalize_input
from proxy.responses.objects import Output
from proxy.sessions.session import Transcript
from proxy.shared.completion import assistant_message
from proxy.shared.errors import BadRequest


def test_a_reply_goes_back_as_the_history_rule_says_so_the_session_continues() -> None:
    first = ResponseRequest.parse({"model": "m", "input": "hi", "instructions": "Be brief."})
    output = Output(text="Hello!").items()
    turn1 = chat_body(first, [])
    second = ResponseRequest.parse({"model": "m", "input": "more", "instructions": "Be brief.",
                                    "previous_response_id": "resp_1"})
    turn2 = chat_body(second, [*first.input, *output])
    assert turn2["messages"] == [*turn1["messages"], assistant_message("Hello!"),
                                 {"role": "user", "content": "more"}]
    # exactly what the router's fingerprint of turn 1 + its reply expects
    held = Transcript.from_chat(turn1["messages"]).held_after("Hello!", 10)
    assert Transcript.from_chat(turn2["messages"]).continues(held)


def test_tool_calls_join_their_assistant_message_and_outputs_are_tool_messages() -> None:
    items = normalize_input([
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": "calling"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
        {"role": "developer", "content": "rule"},
    ])
    messages = item_messages(items)
    assert messages[0] == {"role": "user", "content": "ab"}
    assert messages[1]["content"] == "calling"
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert messages[3] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert messages[4] == {"role": "system", "content": "rule"}


def test_the_request_fields_map_to_chat_fields() -> None:
    request = ResponseRequest.parse({
        "model": "m", "input": "x", "max_output_tokens": 7, "temperature": 0, "stream": True,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"},
                   "strict": True}],
        "tool_choice": {"type": "function", "name": "f"}, "ignore_eos": True,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {}}}})
    body = chat_body(request, [])
    assert body["max_tokens"] == 7 and body["temperature"] == 0 and body["ignore_eos"] is True
    assert body["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}, "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "s", "schema": {}}}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("body", [
    {"model": "m", "input": "x", "store": "yes"},
    {"model": "m", "input": "x", "conversation": 5},
    {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": 1}]},
    {"model": "m", "input": [{"type": "function_call", "name": "f"}]},
    {"model": "m", "input": [{"type": "reasoning"}]},
    {"model": "m", "input": "x", "tools": [{"type": "function"}]},
    {"model": "m", "input": "x", "tool_choice": "sometimes"},
])
def test_what_cannot_be_served_is_a_bad_request(body: dict) -> None:
    with pytest.raises(BadRequest):
        ResponseRequest.parse(body)
