"""The official openai client, unchanged, against the proxy on a real loopback port."""

from __future__ import annotations

import openai

from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import config_for, serve_proxy


async def test_chat_stream_and_not(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        history = [{"role": "user", "content": "Hello?"}]
        raw = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=history, max_tokens=8)  # type: ignore[arg-type]
        first = raw.parse()
        assert raw.headers["x-ppd-route"] == "pd"
        reply = first.choices[0].message.content
        assert reply and reply.startswith("Hello from d")
        history += [{"role": "assistant", "content": reply},
                    {"role": "user", "content": "More?"}]
        stream = await client.chat.completions.create(
            model="fake-model", messages=history, max_tokens=8, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True})
        parts, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        await client.close()
        sessions = await proxy.state.sessions.snapshot()
    assert "".join(parts) == reply
    assert usage is not None and usage.completion_tokens == len(reply.split(" "))
    assert len(sessions) == 1 and sessions[0]["turns"] == 2


async def test_completions_stream_and_not(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        prompt = "User: hi\nAssistant:"
        first = await client.completions.create(model="fake-model", prompt=prompt, max_tokens=4)
        text = first.choices[0].text
        assert text == "Hello from d1, a" or text == "Hello from d2, a"
        prompt2 = prompt + text + "\nUser: more\nAssistant:"
        raw = await client.completions.with_raw_response.create(
            model="fake-model", prompt=prompt2, max_tokens=4, stream=True)
        stream = raw.parse()
        streamed = "".join([c.choices[0].text async for c in stream if c.choices])
        await client.close()
    assert streamed == text
    assert raw.headers["x-ppd-route"] == "local"
    assert raw.headers["x-ppd-turn"] == "2"


async def test_openai_errors_surface_as_openai_exceptions(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        try:
            await client.chat.completions.create(model="nope", messages=[
                {"role": "user", "content": "x"}])
        except openai.NotFoundError as exc:
            assert exc.code == "model_not_found"
        else:
            raise AssertionError("expected NotFoundError")
        finally:
            await client.close()
