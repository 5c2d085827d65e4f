"""Issue #45, failure 4: a client body of a million tiny messages is refused (400 naming
--max-messages) before any per-message work, and other clients keep being served."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson

from proxy.shared.limits import Limits
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.behaviour.test_errors import assert_openai_error
from tests.proxy.helpers import chat_body, config_for, serve_proxy


async def test_a_body_of_950k_messages_is_a_400_naming_the_limit(
        cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster), max_body_bytes=32 * 1024 * 1024)
    body = orjson.dumps({"messages": [{"role": "user", "content": ""}] * 950_000})
    async with serve_proxy(config) as proxy:
        started = time.perf_counter()
        refused = await proxy.client.post("/v1/chat/completions", content=body,
                                          headers={"content-type": "application/json"})
        took = time.perf_counter() - started
        served = await proxy.client.post("/v1/chat/completions", json=chat_body("hi"))
    error = assert_openai_error(refused, 400)
    assert "--max-messages" in error["message"] and error["param"] == "messages"
    assert served.status_code == 200
    assert took < 3.0  # parse and count only (it blocked the loop 2-4 s before, then more)
    assert not any(len(node.completions) > 1 for node in cluster.values())


async def test_the_message_limit_is_a_flag(cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster), limits=Limits(max_messages=3))
    async with serve_proxy(config) as proxy:
        four = await proxy.client.post("/v1/chat/completions",
                                       json=chat_body("a", "b", "c", "d"))
        three = await proxy.client.post("/v1/chat/completions", json=chat_body("a", "b", "c"))
        batch = await proxy.client.post("/v1/completions",
                                        json={"prompt": ["a", "b", "c", "d"], "max_tokens": 2})
        ids = await proxy.client.post("/v1/completions",
                                      json={"prompt": [1, 2, 3, 4, 5], "max_tokens": 2})
    assert "over the limit of 3 (--max-messages)" in assert_openai_error(four, 400)["message"]
    assert three.status_code == 200
    assert assert_openai_error(batch, 400)["param"] == "prompt"
    assert ids.status_code != 400  # token ids are one prompt, not a batch
