"""The official `openai` client against the proxy in front of fake nodes: Responses and
Conversations, routed by identity."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import ProxyUnderTest, config_for, serve_proxy
from tests.proxy.responses.tool_node import ARGUMENTS, ToolNode

TOOLS = [{"type": "function", "name": "weather", "description": "the weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


@contextlib.asynccontextmanager
async def proxied(nodes: dict[str, FakeVLLM], **overrides: Any
                  ) -> AsyncIterator[tuple[ProxyUnderTest, openai.AsyncOpenAI]]:
    async with serve_proxy(config_for(nodes, Policy.LOCAL, **overrides)) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused",
                                    max_retries=0)
        async with client:
            yield proxy, client


@pytest.fixture
async def tool_cluster() -> AsyncIterator[dict[str, FakeVLLM]]:
    async with contextlib.AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(ToolNode(name)) for name in ("p1", "d1")}


async def create(client: openai.AsyncOpenAI, **kwargs: Any) -> tuple[Any, httpx.Headers]:
    raw = await client.responses.with_raw_response.create(model="fake-model", **kwargs)
    return raw.parse(), raw.headers


def decode_messages(node: FakeVLLM) -> list[dict[str, Any]]:
    return node.completions[-1].body["messages"]


async def test_four_turns_by_previous_response_id_continue_one_session_locally(
        cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(cluster) as (_, client):
        first, headers = await create(client, input="turn 1", instructions="Be brief.")
        assert headers["x-ppd-route"] == "pd" and headers["x-ppd-turn"] == "1"
        session, decode = headers["x-ppd-session"], headers["x-ppd-decode"]
        previous = first
        for n in (2, 3, 4):
            response, headers = await create(client, input=f"turn {n}",
                                             instructions="Be brief.",
                                             previous_response_id=previous.id)
            assert (headers["x-ppd-route"], headers["x-ppd-turn"]) == ("local", str(n))
            assert headers["x-ppd-session"] == session and headers["x-ppd-decode"] == decode
            assert response.previous_response_id == previous.id
            previous = response
        node = next(node for node in cluster.values() if node.url == decode)
        messages = decode_messages(node)
        assert messages[0] == {"role": "system", "content": "Be brief."}
        assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * 3 + ["user"]
        assert messages[2]["content"] == first.output_text
        assert messages[-1]["content"] == "turn 4"
        stored = await client.responses.retrieve(previous.id)
        assert stored.output_text == previous.output_text and stored.status == "completed"


async def test_streamed_turns_send_openai_events_and_continue(
        cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(cluster) as (proxy, client):
        first, _ = await create(client, input="hello")
        stream = await client.responses.create(model="fake-model", input="again",
                                               previous_response_id=first.id, stream=True)
        kinds, text, completed = [], "", None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                completed = event.response
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
        assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                              "response.output_item.done", "response.completed"]
        assert completed is not None and completed.output_text == text and text
        assert completed.usage is not None and completed.usage.output_tokens > 0
        stored = await client.responses.retrieve(completed.id)
        assert stored.output_text == text
        # the streamed turn was turn 2, local, and its successor is turn 3
        raw = await proxy.client.post("/v1/responses", json={
            "model": "fake-model", "input": "third", "previous_response_id": completed.id})
        assert (raw.headers["x-ppd-turn"], raw.headers["x-ppd-route"]) == ("3", "local")


async def test_two_turns_naming_one_response_are_two_sessions(
        cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(cluster) as (_, client):
        first, headers = await create(client, input="root")
        _, left = await create(client, input="left", previous_response_id=first.id)
        _, right = await create(client, input="right", previous_response_id=first.id)
        assert left["x-ppd-session"] == headers["x-ppd-session"]
        assert (left["x-ppd-turn"], left["x-ppd-route"]) == ("2", "local")
        assert right["x-ppd-session"] != left["x-ppd-session"]
        assert (right["x-ppd-turn"], right["x-ppd-route"]) == ("1", "pd")


async def test_a_failed_turn_gives_its_claim_back(cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(cluster) as (_, client):
        first, headers = await create(client, input="root")
        decode = next(n for n in cluster.values() if n.url == headers["x-ppd-decode"])
        decode.fail_with(400)
        with pytest.raises(openai.BadRequestError):
            await create(client, input="refused", previous_response_id=first.id)
        _, again = await create(client, input="retry", previous_response_id=first.id)
        assert again["x-ppd-session"] == headers["x-ppd-session"]
        assert again["x-ppd-turn"] == "2"


async def test_a_three_step_tool_loop_runs_as_turns_of_one_session(
        tool_cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(tool_cluster) as (_, client):
        choice = {"type": "function", "name": "weather"}
        call, headers = await create(client, input="Weather in Paris?", tools=TOOLS,
                                     tool_choice=choice)
        session = headers["x-ppd-session"]
        [item] = call.output
        assert (item.type, item.name, item.arguments) == ("function_call", "weather", ARGUMENTS)
        previous = call
        for step in (2, 3):
            previous, headers = await create(
                client, previous_response_id=previous.id, tools=TOOLS,
                tool_choice=choice if step == 2 else "auto",
                input=[{"type": "function_call_output", "call_id": previous.output[-1].call_id
                        if previous.output[-1].type == "function_call" else "none",
                        "output": json.dumps({"celsius": 20 + step})}])
            assert headers["x-ppd-session"] == session
            assert (headers["x-ppd-turn"], headers["x-ppd-route"]) == (str(step), "local")
        assert previous.output_text  # the last step answers in words
        messages = decode_messages(tool_cluster["d1"])
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant",
                                                 "tool"]
        assert messages[1]["tool_calls"][0]["function"] == {"name": "weather",
                                                            "arguments": ARGUMENTS}
        assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"]
        body = tool_cluster["d1"].completions[-1].body
        assert body["tools"][0]["function"]["name"] == "weather"


async def test_a_streamed_tool_call_arrives_as_function_call_events(
        tool_cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(tool_cluster) as (_, client):
        stream = await client.responses.create(
            model="fake-model", input="Weather?", tools=TOOLS, stream=True,  # type: ignore
            tool_choice={"type": "function", "name": "weather"})
        kinds, arguments, done = [], "", None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                arguments += event.delta
            if event.type == "response.completed":
                done = event.response
        assert "response.function_call_arguments.done" in kinds and arguments == ARGUMENTS
        assert done is not None and done.output[0].type == "function_call"


async def test_conversations_hold_items_and_a_turn_in_one_continues_it(
        cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(cluster) as (_, client):
        conversation = await client.conversations.create(
            items=[{"type": "message", "role": "user", "content": "remember 7"}])
        first, headers = await create(client, input="what did I say?",
                                      conversation=conversation.id)
        assert headers["x-ppd-session"] == conversation.id
        second, headers = await create(client, input="and now?",
                                       conversation=conversation.id)
        assert (headers["x-ppd-turn"], headers["x-ppd-route"]) == ("2", "local")
        items = [item async for item in client.conversations.items.list(
            conversation.id, order="asc")]
        assert [item.type for item in items] == ["message"] * 5
        assert items[2].content[0].text == first.output_text
        added = await client.conversations.items.create(
            conversation.id, items=[{"type": "message", "role": "user", "content": "x"}])
        assert len(added.data) == 1
        await client.conversations.delete(conversation.id)
        with pytest.raises(openai.NotFoundError):
            await client.conversations.retrieve(conversation.id)
        with pytest.raises(openai.NotFoundError):
            await create(client, input="gone", conversation=conversation.id)


async def test_input_items_and_delete(cluster: dict[str, FakeVLLM]) -> None:
    async with proxied(cluster) as (_, client):
        first, _ = await create(client, input=[{"role": "user", "content": "a"},
                                               {"role": "user", "content": "b"}])
        items = [item async for item in client.responses.input_items.list(first.id,
                                                                          order="asc")]
        assert [item.content[0].text for item in items] == ["a", "b"]
        await client.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            await create(client, input="after", previous_response_id=first.id)
