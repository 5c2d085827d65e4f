"""Issue #45's failures 9-12 (node answers) replayed against a served `ppd proxy`, each under
the bar of tests/proxy/trust/served.py (/health within 1 s, RSS within +200 MB, the steady
client served 200):

9. a whole answer of 200 MB (it once crashed the proxy);
10. a stream event that never ends (it once grew the proxy 240 MB in 30 s);
11. two answers claiming 10^308 completion tokens, with a NaN elsewhere (every later request
    without max_tokens was a 500 until restart: the steady client here sends none);
12. a token count of 2^63, or of 1e309 (OverflowError, a 500).

D is a scripted node (tests/fakes/scripted_node.py) answering the request whose message is
the attack's marker with the attack, and every other request honestly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.scripted_node import Answer, Script, scripted_node
from tests.proxy.trust.served import MIB, ServedProxy, served_proxy, watching

HONEST_USAGE = '{"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}'
NO_MAX_TOKENS = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def whole(usage: str = HONEST_USAGE, extra: str = "") -> bytes:
    return ('{"id": "x", "object": "chat.completion", "model": "fake-model", "choices": '
            '[{"index": 0, "message": {"role": "assistant", "content": "hi"}, '
            f'"finish_reason": "stop"{extra}}}], "usage": {usage}}}').encode()


def attacked_by(marker: str, attack: Script) -> Script:
    """Answer requests whose first message is `marker` with the attack, others honestly."""
    def script(path: str, body: dict[str, Any]) -> Answer:
        if body["messages"][0].get("content") == marker:
            return attack(path, body)
        if body.get("stream"):
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": "fake-model",
                     "choices": [{"index": 0, "delta": {"content": "hi"},
                                  "finish_reason": "stop"}]}
            return Answer.sse(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")
        return Answer.whole(whole())
    return script


async def ask(proxy: ServedProxy, content: str, **extra: Any) -> httpx.Response:
    """One client request, from a thread (the fakes answer on this loop)."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}
    return await asyncio.to_thread(httpx.post, proxy.url + "/v1/chat/completions", json=body,
                                   timeout=60)


def megabytes(count: int, first: bytes = b"") -> Iterator[bytes]:
    """count MB of one JSON string's inside, made as it is sent."""
    yield first
    piece = b"x" * MIB
    for _ in range(count):
        yield piece


async def test_09_a_200_mb_answer() -> None:
    def huge(path: str, body: dict[str, Any]) -> Answer:
        head = b'{"choices": [{"index": 0, "message": {"content": "'
        return Answer(megabytes(200, head), length=len(head) + 200 * MIB)

    async with FakeVLLM("p") as p, scripted_node(attacked_by("big", huge)) as d, served_proxy(
            ["--prefill", p.url, "--decode", d.url]) as proxy, watching(proxy):
        refused = await ask(proxy, "big")
    assert refused.status_code == 502 and "--max-answer-bytes" in refused.text


async def test_10_a_stream_event_that_never_ends() -> None:
    def endless(path: str, body: dict[str, Any]) -> Answer:
        return Answer(megabytes(650, b"data: "), "text/event-stream")  # no blank line, ever

    async with FakeVLLM("p") as p, scripted_node(attacked_by("endless", endless)) as d, \
            served_proxy(["--prefill", p.url, "--decode", d.url]) as proxy, watching(proxy):
        cut = await ask(proxy, "endless", stream=True)
    # 502 before the first byte, or an in-band error once the stream answered 200.
    assert cut.status_code in (200, 502) and "--max-stream-event-bytes" in cut.text
    assert "[DONE]" not in cut.text


@pytest.mark.parametrize("usage, elsewhere", [
    ('{"prompt_tokens": 5, "completion_tokens": 1' + "0" * 308 + ', "total_tokens": 5}',
     ', "logprobs": {"content": [{"token": "hi", "logprob": NaN}]}'),
], ids=["10^308 and NaN"])
async def test_11_two_answers_claiming_10_to_the_308_tokens(usage: str, elsewhere: str) -> None:
    await poisoned_usage_replay(usage, elsewhere)


@pytest.mark.parametrize("usage", [
    '{"prompt_tokens": 5, "completion_tokens": 9223372036854775808, "total_tokens": 5}',
    '{"prompt_tokens": 5, "completion_tokens": 1e309, "total_tokens": 5}',
], ids=["2^63", "1e309"])
async def test_12_a_token_count_of_2_to_the_63_or_1e309(usage: str) -> None:
    await poisoned_usage_replay(usage, "")


async def poisoned_usage_replay(usage: str, elsewhere: str) -> None:
    def poison(path: str, body: dict[str, Any]) -> Answer:
        return Answer.whole(whole(usage, elsewhere))

    async with FakeVLLM("p") as p, scripted_node(attacked_by("poison", poison)) as d, \
            served_proxy(["--prefill", p.url, "--decode", d.url]) as proxy, \
            watching(proxy, steady_body=NO_MAX_TOKENS):
        refused = [await ask(proxy, "poison"), await ask(proxy, "poison")]
        later = await ask(proxy, "after")  # no max_tokens: the running mean is read
    for response in refused:
        assert response.status_code == 502 and "usage.completion_tokens" in response.text
    assert later.status_code == 200
