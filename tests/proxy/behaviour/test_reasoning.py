"""A reasoning model behind the proxy: the history rule (docs/architecture.md, "Session
tracking") decides which follow-ups continue the session."""

from __future__ import annotations

import pytest

from proxy.shared.completion import ReplyCapture
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, serve_proxy

THOUGHT = "The user greets me so I greet back."


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("echo", "continues"), [
    ("content only", True),  # what the rule says, and what ppd replay sends
    ("reasoning field echoed", True),  # extra fields of a message are not compared
    ("reasoning in content", False),  # another text: a new branch
])
async def test_which_follow_ups_continue_a_reasoning_session(
        stream: bool, echo: str, continues: bool) -> None:
    async with FakeVLLM("p1") as p1, FakeVLLM("d1", reasoning=THOUGHT) as d1, serve_proxy(
            config_for({"p1": p1, "d1": d1})) as proxy:
        first = await proxy.client.post("/v1/chat/completions",
                                        json=chat_body("Hello", stream=stream))
        capture = ReplyCapture(stream)
        capture.feed(first.content)
        reply = capture.finish()
        assert (reply.text, reply.reasoning.strip()) == (d1.reply, THOUGHT)
        body = chat_body("Hello", "placeholder", "And then?")
        assistant = body["messages"][1]
        assistant["content"] = reply.text
        if echo == "reasoning field echoed":
            assistant["reasoning_content"] = reply.reasoning
        elif echo == "reasoning in content":
            assistant["content"] = reply.reasoning + reply.text
        second = await proxy.client.post("/v1/chat/completions", json=body)
    assert second.status_code == 200
    assert second.headers["x-ppd-turn"] == ("2" if continues else "1")
    assert second.headers["x-ppd-route"] == ("local" if continues else "pd")
