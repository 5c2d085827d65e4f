"""profiler.emulate.openai_format: the one encoder of vLLM's answers (emulated nodes, test
fakes, the benchmark backend) and the request parser, read back by the proxy's own reader."""

from __future__ import annotations

import json

import pytest

from profiler.emulate.openai_format import DONE, Envelope, RequestError, parse, usage
from proxy.shared.completion import ReplyCapture


@pytest.mark.parametrize("chat", [True, False])
def test_a_stream_the_encoder_writes_is_read_whole_by_the_proxy(chat: bool) -> None:
    envelope = Envelope.new("r1", "m", chat)
    events = [envelope.chunk(None, role=True)] if chat else []
    if chat:
        events.append(envelope.reasoning_chunk("thinking "))
    events += [envelope.chunk("Hello"), envelope.chunk(" there"), envelope.chunk(None, "length"),
               envelope.usage_chunk(usage(5, 2, 3)), DONE]
    capture = ReplyCapture(stream=True)
    for event in events:
        capture.feed(event)
    captured = capture.finish()
    assert (captured.text, captured.finish_reason, captured.complete) == (
        "Hello there", "length", True)
    assert captured.reasoning == ("thinking " if chat else "")
    assert captured.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                              "prompt_tokens_details": {"cached_tokens": 3}}


def test_a_whole_answer_carries_text_reasoning_usage_and_kv_params() -> None:
    answer = Envelope.new("r1", "m", True).complete(
        "Hi", "stop", usage(5, 1, None), {"remote_block_ids": [1]}, reasoning="hmm")
    assert answer["object"] == "chat.completion" and answer["id"] == "chatcmpl-r1"
    assert answer["choices"][0]["message"]["reasoning_content"] == "hmm"
    assert answer["kv_transfer_params"] == {"remote_block_ids": [1]}
    capture = ReplyCapture(stream=False)
    capture.feed(json.dumps(answer).encode())
    captured = capture.finish()
    assert (captured.text, captured.reasoning, captured.complete) == ("Hi", "hmm", True)


@pytest.mark.parametrize(("body", "chat", "param"), [
    ({"messages": []}, True, "messages"),
    ({"prompt": ""}, False, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, False, "max_tokens"),
    ({"prompt": "x", "n": 2}, False, "n"),
    ({"prompt": "x", "kv_transfer_params": []}, False, "kv_transfer_params"),
])
def test_what_vllm_rejects_is_a_400_naming_the_field(body: dict[str, object], chat: bool,
                                                      param: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse(body, chat)
    assert (refused.value.status, refused.value.param) == (400, param)
    assert refused.value.body()["error"]["param"] == param


def test_a_p_leg_and_a_d_leg_are_told_apart_by_their_kv_params() -> None:
    p_leg = parse({"prompt": [1, 2], "kv_transfer_params": {"do_remote_decode": True}}, False)
    d_leg = parse({"prompt": ["x"], "kv_transfer_params": {"do_remote_prefill": True}}, False)
    assert (p_leg.wants_remote_decode, p_leg.prompt_ids) == (True, [1, 2])
    assert (d_leg.wants_remote_prefill, d_leg.prompt_text) == (True, "x")
