"""A response chain as one chat-completions request: the legs keep vLLM's prompt rendering.

The turns go to the nodes as chat completions, not as vLLM's `/v1/responses` (which accepts
`kv_transfer_params` since 0.11): vLLM renders a Responses request through the same chat
template and renderer as a chat request (`vllm.entrypoints.openai.responses.serving` ->
`vllm.renderers`), so the prompt is the same token for token, and every leg the router runs -
P with `max_tokens: 1`, D with P's `kv_transfer_params`, the readback's `return_token_ids`,
the session fingerprint of the reply - is the chat one the proxy already routes and tests.
vLLM's own store is per server and off by default, so it could not carry a chain across P and
D anyway; the proxy keeps the chain (`proxy.responses.store`) and sends it whole.

The messages for a turn: the instructions (this turn's only: OpenAI does not carry them over
a `previous_response_id`) as a system message, then every earlier item, then the new input.
A function call joins the assistant message before it (one assistant turn with text and
tool calls, as chat completions returns it), a `function_call_output` is a `tool` message.
The assistant message of a text reply is `{"role": "assistant", "content": text}` -
`proxy.shared.completion.assistant_message`, the history rule the session fingerprint checks - so
a turn naming its previous response extends exactly what the D of that session holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from proxy.responses.items import SAMPLING_FIELDS, ResponseRequest

_CHAT_ROLE = {"developer": "system"}  # chat templates know system, not developer


def item_messages(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored items as chat messages."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": _CHAT_ROLE.get(item["role"], item["role"]),
                             "content": text})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                # "" rather than null: a chat template that adds strings (ChatML's) renders it.
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": item["output"]})
    return messages


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools (flat) as chat completions has them (under `function`)."""
    return [{"type": "function", "function": {
        key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool
    }} for tool in tools]


def chat_tool_choice(choice: Any) -> Any:
    """`{"type": "function", "name": N}` -> chat's `{"type": "function", "function": {...}}`."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_body(request: ResponseRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body of a turn: history (earlier items) + the request's input."""
    messages = item_messages([*history, *request.input])
    if request.instructions:
        messages.insert(0, {"role": "system", "content": request.instructions})
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    for name in SAMPLING_FIELDS:
        if request.body.get(name) is not None:
            body[name] = request.body[name]
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if request.tools:
        body["tools"] = chat_tools(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(request.tool_choice)
    text = request.body.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            key: text_format[key] for key in ("name", "schema", "strict") if key in text_format}}
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body
