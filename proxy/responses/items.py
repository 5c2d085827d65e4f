"""The Responses API request: its fields read and checked, its input as normalized items.

OpenAI's `POST /v1/responses` body (https://platform.openai.com/docs/api-reference/responses):
`input` is a string (one user message) or a list of items - messages (`{"role", "content"}`,
`type: "message"` optional, content a string or `input_text`/`output_text` parts),
`function_call` (the model's call, echoed back by a client that keeps its own history) and
`function_call_output` (the tool's result for a `call_id`). Items are stored as OpenAI shows
them (each with an `id`), so `GET .../input_items` and a conversation's items read back what
was sent; `proxy.responses.chain` turns them into chat messages.

Only what the proxy can honour is accepted: a field it would have to ignore (a hosted tool,
an image) is a 400, never silently dropped.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from proxy.shared.errors import BadRequest

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")
# Sampling fields passed to the nodes as chat completions has them (the last four are vLLM's
# extensions, as its chat endpoint takes them).
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "stop", "frequency_penalty",
                   "presence_penalty", "top_k", "min_p", "repetition_penalty", "ignore_eos")
# Fields accepted and answered as the client sent them, with no effect on the turn.
ECHOED_FIELDS = ("metadata", "user", "parallel_tool_calls", "truncation", "service_tier",
                 "prompt_cache_key", "safety_identifier", "background", "include", "reasoning")
KNOWN_FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "conversation", "store",
    "stream", "stream_options", "max_output_tokens", "tools", "tool_choice", "text",
    *SAMPLING_FIELDS, *ECHOED_FIELDS})


def new_id(prefix: str) -> str:
    """An OpenAI-style object id (`resp_...`, `msg_...`, `conv_...`): 48 random hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(frozen=True, slots=True)
class ResponseRequest:
    """A checked `POST /v1/responses` body."""

    body: dict[str, Any]
    model: str
    input: list[dict[str, Any]]  # normalized items, ids assigned
    instructions: str | None
    previous_response_id: str | None
    conversation: str | None
    store: bool
    stream: bool
    max_output_tokens: int | None
    tools: list[dict[str, Any]]
    tool_choice: Any

    @staticmethod
    def parse(body: dict[str, Any]) -> ResponseRequest:
        """Check a decoded body (BadRequest naming the field at fault)."""
        unknown = sorted(set(body) - KNOWN_FIELDS)
        if unknown:
            raise BadRequest(f"unsupported parameter {unknown[0]!r} (this proxy serves "
                             "text, function tools and stored state)", param=unknown[0])
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' must be a non-empty string", param="model")
        previous = _optional_str(body, "previous_response_id")
        conversation = _conversation_id(body.get("conversation"))
        if previous is not None and conversation is not None:
            raise BadRequest("'previous_response_id' and 'conversation' cannot be used together",
                             param="conversation")
        max_out = body.get("max_output_tokens")
        if max_out is not None and (not isinstance(max_out, int) or isinstance(max_out, bool)
                                    or max_out < 1):
            raise BadRequest("'max_output_tokens' must be an integer >= 1",
                             param="max_output_tokens")
        for name in ("store", "stream"):
            if name in body and body[name] is not None and not isinstance(body[name], bool):
                raise BadRequest(f"'{name}' must be a boolean", param=name)
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be a list", param="tools")
        for tool in tools:
            check_tool(tool)
        return ResponseRequest(
            body, model, normalize_input(body.get("input")),
            _optional_str(body, "instructions"), previous, conversation,
            body.get("store") is not False, body.get("stream") is True, max_out, tools,
            check_tool_choice(body.get("tool_choice"), tools))


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string", param=name)
    return value


def _conversation_id(value: Any) -> str | None:
    """`conversation` is an id or `{"id": ...}` (OpenAI accepts both)."""
    if isinstance(value, dict):
        value = value.get("id")
        if not isinstance(value, str):
            raise BadRequest("'conversation.id' must be a string", param="conversation")
    if value is not None and not isinstance(value, str):
        raise BadRequest("'conversation' must be a conversation id or {\"id\": ...}",
                         param="conversation")
    return value


def normalize_input(value: Any, param: str = "input") -> list[dict[str, Any]]:
    """The input as items: a string is one user message; each item checked, given an id."""
    if isinstance(value, str):
        return [message_item("user", [{"type": "input_text", "text": value}])]
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{param}' must be a string or a non-empty list of items", param=param)
    return [normalize_item(item, f"{param}[{i}]") for i, item in enumerate(value)]


def message_item(role: str, content: list[dict[str, Any]],
                 item_id: str | None = None) -> dict[str, Any]:
    """A message item as OpenAI stores it."""
    return {"type": "message", "id": item_id or new_id("msg"), "status": "completed",
            "role": role, "content": content}


def normalize_item(item: Any, param: str) -> dict[str, Any]:
    """One input item in its stored form (BadRequest for what the proxy cannot serve)."""
    if not isinstance(item, dict):
        raise BadRequest(f"'{param}' must be an object", param=param)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise BadRequest(f"'{param}.role' must be one of {list(MESSAGE_ROLES)}", param=param)
        return message_item(role, _content_parts(item.get("content"), role, param),
                            _item_id(item, param))
    if kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise BadRequest(f"'{param}.{name}' must be a string", param=param)
        return {"type": "function_call", "id": _item_id(item, param) or new_id("fc"),
                "status": "completed", "call_id": item["call_id"], "name": item["name"],
                "arguments": item["arguments"]}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str):
            raise BadRequest(f"'{param}.call_id' must be a string", param=param)
        if not isinstance(output, str):
            raise BadRequest(f"'{param}.output' must be a string", param=param)
        return {"type": "function_call_output", "id": _item_id(item, param) or new_id("fco"),
                "status": "completed", "call_id": item["call_id"], "output": output}
    raise BadRequest(f"'{param}.type' {kind!r} is not supported (message, function_call, "
                     "function_call_output)", param=param)


def _item_id(item: dict[str, Any], param: str) -> str | None:
    value = item.get("id")
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{param}.id' must be a string", param=param)
    return value


def _content_parts(content: Any, role: str, param: str) -> list[dict[str, Any]]:
    part_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": part_type, "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"'{param}.content' must be a string or a list of text parts",
                         param=param)
    parts = []
    for part in content:
        if (not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS
                or not isinstance(part.get("text"), str)):
            raise BadRequest(f"'{param}.content' holds a part that is not text (only "
                             f"{list(_TEXT_PARTS)} are served)", param=param)
        parts.append({"type": part["type"], "text": part["text"]})
    return parts


def check_tool(tool: Any) -> None:
    """A function tool (`{"type": "function", "name", "parameters", ...}`), else BadRequest."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        shown = tool.get("type") if isinstance(tool, dict) else tool
        raise BadRequest(f"tool type {shown!r} is not supported: only function tools",
                         param="tools")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise BadRequest("a function tool needs a 'name'", param="tools")


def check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> Any:
    """`auto`/`none`/`required`, or `{"type": "function", "name": N}` naming a given tool."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not any(tool["name"] == choice.get("name") for tool in tools):
            raise BadRequest(f"'tool_choice' names {choice.get('name')!r}, which is not in "
                             "'tools'", param="tool_choice")
        return choice
    raise BadRequest("'tool_choice' must be auto, none, required or "
                     "{\"type\": \"function\", \"name\": ...}", param="tool_choice")
