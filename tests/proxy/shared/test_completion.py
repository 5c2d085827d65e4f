"""The one completion-response reader: SSE or JSON, chat or completions, reasoning apart."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.shared.completion import (
    Captured,
    ReplyCapture,
    assistant_message,
    parse_data,
    parse_payload,
)


def sse(*payloads: object) -> bytes:
    return b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in payloads) + b"data: [DONE]\n\n"


def test_capture_chat_stream_split_anywhere() -> None:
    data = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
               {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
               {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
               {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
               {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    for split in (1, 7, len(data) // 2):
        capture = ReplyCapture(stream=True)
        for i in range(0, len(data), split):
            capture.feed(data[i:i + split])
        captured = capture.finish()
        assert (captured.text, captured.complete, captured.finish_reason) == (
            "Hello", True, "stop")
        assert captured.usage == {"prompt_tokens": 5, "completion_tokens": 2}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_is_read_apart_from_the_reply(field: str) -> None:
    capture = ReplyCapture(stream=True)
    capture.feed(sse({"choices": [{"index": 0, "delta": {field: "Let me "}}]},
                     {"choices": [{"index": 0, "delta": {field: "think."}}]},
                     {"choices": [{"index": 0, "delta": {"content": "42"},
                                   "finish_reason": "stop"}]}))
    captured = capture.finish()
    assert (captured.text, captured.reasoning, captured.complete) == ("42", "Let me think.", True)
    whole = parse_payload({"choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "42",
                                                    field: "Let me think."}}]})
    assert (whole.text, whole.reasoning, whole.has_tokens) == ("42", "Let me think.", True)


def test_a_server_sending_both_reasoning_fields_is_read_once() -> None:
    both = parse_data(json.dumps({"choices": [{"index": 0, "delta": {
        "reasoning": "Hmm.", "reasoning_content": "Hmm.", "content": None}}]}))
    assert (both.text, both.reasoning) == ("", "Hmm.")
    assert parse_payload({"choices": {"index": 0}}).has_tokens is False  # not a list


def test_capture_incomplete_and_error_streams() -> None:
    cut = ReplyCapture(stream=True)
    cut.feed(b'data: {"choices": [{"index": 0, "text": "Hi"}]}\n\n')
    assert cut.finish().complete is False
    errored = ReplyCapture(stream=True)
    errored.feed(b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n')
    assert errored.finish().complete is False


def test_capture_plain_json() -> None:
    capture = ReplyCapture(stream=False)
    capture.feed(b'{"choices": [{"index": 0, "text": "Yes", "finish_reason": "stop"}],')
    capture.feed(b' "usage": {"prompt_tokens": 3, "completion_tokens": 1}}')
    captured = capture.finish()
    assert (captured.text, captured.complete, captured.usage) == (
        "Yes", True, {"prompt_tokens": 3, "completion_tokens": 1})
    broken = ReplyCapture(stream=False)
    broken.feed(b"{not json")
    assert broken.finish().complete is False


def test_parse_data_says_done_error_or_what_arrived() -> None:
    assert parse_data(" [DONE]").done
    assert "malformed" in (parse_data("{not json").error or "")
    assert parse_data('["a list"]').error is not None
    assert parse_data('{"error": {"message": "boom"}}').error == "upstream error: boom"
    role_only = parse_data('{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}')
    assert not role_only.has_tokens and role_only.error is None


def test_the_history_holds_the_reply_text_only() -> None:
    assert assistant_message("42") == {"role": "assistant", "content": "42"}


@pytest.mark.parametrize("end", ["\n\n", "\r\n\r\n", "\r\r"])
def test_capture_takes_every_sse_line_ending(end: str) -> None:
    capture = ReplyCapture(stream=True)
    events = ['data: {"choices": [{"index": 0, "text": "Hi"}]}', "data: [DONE]"]
    capture.feed("".join(event + end for event in events).encode())
    assert capture.finish() == Captured("Hi", "", None, None, True)


def test_capture_follows_a_stream_that_changes_its_line_ending() -> None:
    # "\n\n" events first (the fast path looks for nothing else), then CRLF ones.
    capture = ReplyCapture(stream=True)
    capture.feed(b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n')
    capture.feed(b'data: {"choices": [{"index": 0, "text": "b"}]}\r\n\r\n'
                 b'data: {"choices": [{"index": 0, "text": "c"}]}\n\ndata: [DONE]\r\n\r\n')
    assert capture.finish() == Captured("abc", "", None, None, True)


def test_a_payload_python_json_allows_but_orjson_refuses_is_still_read() -> None:
    # NaN in a logprob: the standard library's reading, not a malformed event.
    delta = parse_data(b'{"choices": [{"index": 0, "text": "x", "logprobs": NaN}]}')
    assert delta.error is None and delta.text == "x"


def _chat_delta(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_capture_knows_done_as_soon_as_it_passes_even_split_inside_the_marker() -> None:
    data = sse(_chat_delta("a"), _chat_delta("b"))
    at = data.index(b"[DONE]") + 3  # "data: [DO" | "NE]\n\n"
    capture = ReplyCapture(stream=True)
    capture.feed(data[:at])
    assert not capture.stream_done
    capture.feed(data[at:])
    assert capture.stream_done  # the relay records the turn before it sends `[DONE]`
    assert capture.finish().text == "ab"


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: 1, 2\n\n", b"data:\n\n"])
def test_one_malformed_event_among_many_fails_the_capture(bad: bytes) -> None:
    good = sse(_chat_delta("a"))
    capture = ReplyCapture(stream=True)
    capture.feed(good[:-len(b"data: [DONE]\n\n")] + bad + b"data: [DONE]\n\n")
    captured = capture.finish()
    assert captured.text == "a" and captured.complete is False


# The capture parses lazily and without a Delta per event; what it reads must be exactly
# what parsing each event with `parse_data` as it arrived reads, however the bytes are cut.
_payloads = st.one_of(
    st.builds(lambda content, reasoning, finish, index: {"choices": [{
        "index": index, "delta": {"content": content, "reasoning": reasoning},
        "finish_reason": finish}]},
        st.one_of(st.none(), st.text(max_size=5)), st.one_of(st.none(), st.text(max_size=3)),
        st.sampled_from([None, "", "stop", "length"]), st.sampled_from([0, 0, 1])),
    st.builds(lambda text: {"choices": [{"index": 0, "text": text}]}, st.text(max_size=5)),
    st.builds(lambda n: {"choices": [], "usage": {"completion_tokens": n}}, st.integers(0, 9)),
    st.just({"choices": []}), st.just({"usage": {}}), st.just({"error": {"message": "x"}}),
    st.just([1, 2]), st.just({"choices": {"index": 0}}),
)
_events = st.lists(st.one_of(_payloads.map(lambda p: json.dumps(p).encode()),
                             st.just(b"[DONE]"), st.just(b"{not json")), max_size=12)


def _reference(events: list[bytes]) -> tuple[str, str, Any, Any, bool, int]:
    text, reasoning, usage, finish, done, failed, tokens = "", "", None, None, False, False, 0
    for event in events:
        delta = parse_data(event)
        if delta.error is not None:
            failed = True
            continue
        done = done or delta.done
        tokens += delta.has_tokens
        text += delta.text
        reasoning += delta.reasoning
        usage = delta.usage or usage
        finish = delta.finish_reason or finish
    return text, reasoning, usage, finish, done and not failed, tokens


@settings(max_examples=300, deadline=None)
@given(events=_events, ending=st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r"]),
       cuts=st.lists(st.integers(1, 40), max_size=20), extra_line=st.booleans())
def test_the_capture_reads_what_parsing_each_event_reads(
        events: list[bytes], ending: bytes, cuts: list[int], extra_line: bool) -> None:
    comment = b": keep-alive" + ending[: len(ending) // 2] if extra_line else b""
    body = b"".join(comment + b"data: " + event + ending for event in events)
    capture, at = ReplyCapture(stream=True), 0
    for cut in cuts:
        capture.feed(body[at:at + cut])
        at += cut
    capture.feed(body[at:])
    tokens = capture.token_events
    captured = capture.finish()
    assert (captured.text, captured.reasoning, captured.usage, captured.finish_reason,
            captured.complete, tokens) == _reference(events)
