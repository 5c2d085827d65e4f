"""The Responses API done-when (issue #44) on a real 1P1D vLLM-CPU cluster (tiny model, NIXL):
the official openai client against `ppd proxy --policy local`. A 4-turn conversation by
previous_response_id, streamed and not: turn 1 P->D, turns 2+ local on the D that holds the
history (route headers; P's /metrics counters untouched), every answer at temperature 0 equal
to the chat-completions route's for the same history. A 3-step function-tool loop with
tool_choice naming the function (vLLM's structured output), equal to chat completions' calls.
Conversations: create, items, a turn in one continuing it, delete."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from profiler.cluster.launcher import Cluster
from proxy.shared.vocabulary import Role
from tests.e2e.support import REQUESTS, counters, delta, filler, proxy_for, start_e2e_cluster

MAX_TOKENS = 12
SAMPLING: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                         "properties": {"city": {"type": "string",
                                                 "enum": ["Paris", "Rome", "Oslo"]}}}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                if k != "type"}}]


@pytest.fixture(scope="module")
def cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 1P1D cluster of its own: vLLM 0.32 answers a named tool_choice only with a tool
    parser (`online_renderer`: "requires --tool-call-parser to be set"), which it loads only
    with --enable-auto-tool-choice (`ParserManager.get_tool_parser`); pythonic needs no
    special tokens, and a named choice is not parsed (the structured output's JSON is the
    call's arguments). Compact JSON: the random tiny model would fill the arguments'
    whitespace to any length."""
    with start_e2e_cluster("1P1D", tiny_model, tmp_path_factory, vllm_args=(
            "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}')) as started:
        yield started


@pytest.fixture(scope="module")
def p_url(cluster: Cluster) -> str:
    return cluster.url(Role.PREFILL)


@pytest.fixture(scope="module")
def d_url(cluster: Cluster) -> str:
    return cluster.url(Role.DECODE)


@pytest.fixture(scope="module")
def client(cluster: Cluster, tiny_model: Path) -> Iterator[openai.OpenAI]:
    with proxy_for(cluster, "local", tiny_model) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def respond(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[Any, dict[str, str]]:
    """One Responses turn: the response (a stream's `response.completed` one) and headers."""
    raw = client.responses.with_raw_response.create(model="tiny", stream=stream, **kwargs)
    headers = {k: v for k, v in raw.headers.items() if k.startswith("x-ppd-")}
    if not stream:
        return raw.parse(), headers
    done, text, kinds = None, "", []
    for event in raw.parse():
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):  # incomplete: cut
            done = event.response  # at max_output_tokens, as OpenAI ends such a stream
    assert done is not None and done.output_text == text, kinds[-3:]
    return done, headers


def chat_answer(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool,
                session: str, **kwargs: Any) -> Any:
    """The chat-completions route's answer for the same history (its own session)."""
    create = client.chat.completions.create
    extra = {"extra_headers": {"x-session-id": session}, **SAMPLING, **kwargs}
    if not stream:
        return create(model="tiny", messages=messages, stream=False,  # type: ignore[arg-type]
                      **extra).choices[0].message
    text = ""
    for chunk in create(model="tiny", messages=messages, stream=True,  # type: ignore
                        **extra):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_four_turns_by_previous_response_id_run_local_on_d_and_equal_chat(
        client: openai.OpenAI, p_url: str, d_url: str, stream: bool) -> None:
    history: list[dict[str, Any]] = []
    previous = None
    session = None
    for n in range(1, 5):
        text = filler(300 if n == 1 else 30, seed=440 + 10 * n + stream)
        before = counters(p_url)
        response, headers = respond(client, stream, input=text, previous_response_id=previous,
                                    max_output_tokens=MAX_TOKENS, **SAMPLING)
        on_p = delta(before, counters(p_url))[REQUESTS]
        assert response.status in ("completed", "incomplete")
        session = session or headers["x-ppd-session"]
        assert headers["x-ppd-session"] == session and headers["x-ppd-turn"] == str(n)
        assert headers["x-ppd-decode"] == d_url
        if n == 1:
            assert headers["x-ppd-route"] == "pd" and on_p == 1
        else:  # local on the D that holds the history: P never sees the turn
            assert headers["x-ppd-route"] == "local" and "x-ppd-prefill" not in headers
            assert on_p == 0
        history.append({"role": "user", "content": text})
        expected = chat_answer(client, history, stream, f"chat-twin-{stream}",
                               max_tokens=MAX_TOKENS)
        assert response.output_text == (expected if stream else expected.content), n
        history.append({"role": "assistant", "content": response.output_text})
        previous = response.id
    assert client.responses.retrieve(previous).output_text == history[-1]["content"]


def test_a_three_step_function_tool_loop_runs_local_and_equals_chat(
        client: openai.OpenAI, d_url: str) -> None:
    named = {"type": "function", "name": "get_weather"}
    chat_named = {"type": "function", "function": {"name": "get_weather"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris? " + filler(40, seed=71)}]
    response, headers = respond(client, False, input=messages[0]["content"], tools=TOOLS,
                                tool_choice=named, max_output_tokens=40, temperature=0)
    session = headers["x-ppd-session"]
    for step in (1, 2, 3):
        if step > 1:
            call = response.output[-1]
            output = json.dumps({"celsius": 18 + step})
            messages.append({"role": "tool", "tool_call_id": call.call_id, "content": output})
            last = step == 3
            response, headers = respond(
                client, False, previous_response_id=response.id, tools=TOOLS,
                input=[{"type": "function_call_output", "call_id": call.call_id,
                        "output": output}],
                tool_choice="none" if last else named,
                max_output_tokens=MAX_TOKENS if last else 40, **(SAMPLING if last else
                                                                 {"temperature": 0}))
            assert (headers["x-ppd-route"], headers["x-ppd-turn"]) == ("local", str(step))
            assert headers["x-ppd-session"] == session and headers["x-ppd-decode"] == d_url
        twin = chat_answer(client, messages, False, "chat-twin-tools", tools=CHAT_TOOLS,
                           tool_choice="none" if step == 3 else chat_named,
                           max_tokens=MAX_TOKENS if step == 3 else 40,
                           **({} if step == 3 else {"extra_body": {}}))
        if step == 3:
            assert [item.type for item in response.output] == ["message"]
            assert response.output_text == twin.content
            break
        [call] = response.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments)["city"] in ("Paris", "Rome", "Oslo")
        assert call.arguments == twin.tool_calls[0].function.arguments
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]})


def test_conversations_create_items_continue_and_delete(client: openai.OpenAI,
                                                        d_url: str) -> None:
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": filler(200, seed=91)}])
    routes = []
    for n in (1, 2):
        raw = client.responses.with_raw_response.create(
            model="tiny", input=filler(20, seed=91 + n), conversation=conversation.id,
            max_output_tokens=MAX_TOKENS, **SAMPLING)
        routes.append((raw.headers["x-ppd-route"], raw.headers["x-ppd-turn"],
                       raw.headers["x-ppd-session"]))
        assert raw.headers["x-ppd-decode"] == d_url
    assert routes == [("pd", "1", conversation.id), ("local", "2", conversation.id)]
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert [getattr(item, "role", None) for item in items] == [
        "user", "user", "assistant", "user", "assistant"]
    client.conversations.delete(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="again", conversation=conversation.id)
