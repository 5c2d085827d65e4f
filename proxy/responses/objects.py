"""The objects the Responses API answers with, built from what a chat completion returned.

`Output` gathers one turn's output - the assistant text and the tool calls - from a whole chat
answer (`Output.from_chat`) or from streamed deltas (`add_text`, `add_tool_call_delta`), and
gives it back as OpenAI output items. `response_object` is the `response` object itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from proxy.responses.items import ResponseRequest, message_item, new_id


@dataclass(slots=True)
class ToolCall:
    """One function call the model made (its arguments grow while streaming)."""

    call_id: str
    name: str
    arguments: str = ""
    item_id: str = field(default_factory=lambda: new_id("fc"))

    def item(self) -> dict[str, Any]:
        """The `function_call` output item."""
        return {"type": "function_call", "id": self.item_id, "status": "completed",
                "call_id": self.call_id, "name": self.name, "arguments": self.arguments}


@dataclass(slots=True)
class Output:
    """A turn's output: text, tool calls by their stream index, finish reason and usage."""

    text: str = ""
    calls: dict[int, ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    message_id: str = field(default_factory=lambda: new_id("msg"))

    @staticmethod
    def from_chat(answer: dict[str, Any]) -> Output:
        """The output of a whole (non-streamed) chat completion."""
        out = Output(usage=answer.get("usage") if isinstance(answer.get("usage"), dict) else None)
        choices = answer.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message") or {}
        out.text = message.get("content") or ""
        for i, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            out.calls[i] = ToolCall(call.get("id") or new_id("call"), function.get("name", ""),
                                    function.get("arguments") or "")
        out.finish_reason = choice.get("finish_reason")
        return out

    def add_text(self, text: str) -> None:
        """A streamed piece of the reply."""
        self.text += text

    def add_tool_call_delta(self, delta: dict[str, Any]) -> tuple[ToolCall, bool, str]:
        """A streamed tool-call delta: the call, whether it is new, the arguments added."""
        index = delta.get("index", 0)
        function = delta.get("function") or {}
        call = self.calls.get(index)
        created = call is None
        if call is None:
            call = self.calls[index] = ToolCall(delta.get("id") or new_id("call"),
                                                function.get("name") or "")
        elif function.get("name") and not call.name:
            call.name = function["name"]
        added = function.get("arguments") or ""
        call.arguments += added
        return call, created, added

    def items(self) -> list[dict[str, Any]]:
        """The output items: the message (when there is text, or nothing else), then calls."""
        items = []
        if self.text or not self.calls:
            items.append(message_item(
                "assistant", [{"type": "output_text", "text": self.text, "annotations": []}],
                self.message_id))
        items.extend(call.item() for call in self.calls.values())
        return items

    def status(self) -> tuple[str, dict[str, Any] | None]:
        """The response's status and incomplete_details."""
        if self.finish_reason == "length":
            return "incomplete", {"reason": "max_output_tokens"}
        return "completed", None

    def response_usage(self) -> dict[str, Any] | None:
        """Chat usage as the Responses API names it."""
        if self.usage is None:
            return None
        prompt = int(self.usage.get("prompt_tokens") or 0)
        completion = int(self.usage.get("completion_tokens") or 0)
        cached = int((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion}


def response_object(response_id: str, request: ResponseRequest, status: str,
                    output: list[dict[str, Any]], *, created_at: int | None = None,
                    usage: dict[str, Any] | None = None,
                    incomplete: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `response` object, with every field OpenAI's carries."""
    body = request.body
    return {
        "id": response_id, "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status, "error": error, "incomplete_details": incomplete,
        "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
        "model": request.model, "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": request.previous_response_id,
        "conversation": ({"id": request.conversation} if request.conversation else None),
        "reasoning": body.get("reasoning"), "store": request.store,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": request.tools, "truncation": body.get("truncation", "disabled"),
        "usage": usage, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }
