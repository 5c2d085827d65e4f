"""A streamed chat completion as the Responses API's server-sent events.

OpenAI's event types and order (https://platform.openai.com/docs/api-reference/responses-
streaming): `response.created`, `response.in_progress`; per output item
`response.output_item.added`, for a message `response.content_part.added`, its
`response.output_text.delta`s, `response.output_text.done`, `response.content_part.done`, for
a function call its `response.function_call_arguments.delta`s and `.done`; then
`response.output_item.done`; at the end `response.completed` (or `response.incomplete`, or
`response.failed`). Every event carries `type` and a growing `sequence_number` and goes out as
`event: TYPE` + `data: JSON`. There is no `[DONE]`.
"""

from __future__ import annotations

from typing import Any

from proxy.responses.items import ResponseRequest
from proxy.responses.objects import Output, ToolCall, response_object
from proxy.shared.json_codec import dumps


class EventWriter:
    """One response's events, from the chat chunks of its turn (`feed`) to its end."""

    def __init__(self, response_id: str, request: ResponseRequest, created_at: int) -> None:
        self.response_id = response_id
        self.request = request
        self.created_at = created_at
        self.output = Output()
        self._sequence = 0
        self._next_index = 0
        self._message_index: int | None = None
        self._call_index: dict[str, int] = {}  # output index by the call's item id

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        items = self.output.items() if status != "in_progress" else []
        return response_object(self.response_id, self.request, status, items,
                               created_at=self.created_at, **extra)

    def opening(self) -> bytes:
        """`response.created` and `response.in_progress`."""
        response = self._response("in_progress")
        return (self._event("response.created", response=response)
                + self._event("response.in_progress", response=response))

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events one chat chunk makes (its text, tool calls, finish reason, usage)."""
        out = b""
        if isinstance(chunk.get("usage"), dict):
            self.output.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            for call_delta in delta.get("tool_calls") or ():
                call, created, added = self.output.add_tool_call_delta(call_delta)
                out += self._call(call, created, added)
            if isinstance(choice.get("finish_reason"), str):
                self.output.finish_reason = choice["finish_reason"]
        return out

    def _text(self, text: str) -> bytes:
        out = b""
        output = self.output
        if self._message_index is None:
            self._message_index = self._claim_index()
            out += self._event("response.output_item.added", output_index=self._message_index,
                               item={"type": "message", "id": output.message_id,
                                     "status": "in_progress", "role": "assistant",
                                     "content": []})
            out += self._event("response.content_part.added", item_id=output.message_id,
                               output_index=self._message_index, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": []})
        output.add_text(text)
        return out + self._event("response.output_text.delta", item_id=output.message_id,
                                 output_index=self._message_index, content_index=0,
                                 delta=text, logprobs=[])

    def _call(self, call: ToolCall, created: bool, added: str) -> bytes:
        out = b""
        if created:
            index = self._call_index[call.item_id] = self._claim_index()
            item = {**call.item(), "status": "in_progress", "arguments": ""}
            out += self._event("response.output_item.added", output_index=index, item=item)
        if added:
            out += self._event("response.function_call_arguments.delta", item_id=call.item_id,
                               output_index=self._call_index[call.item_id], delta=added)
        return out

    def _claim_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def closing(self) -> tuple[bytes, dict[str, Any]]:
        """The events that finish every open item, and the finished response (whose
        `response.completed` or `.incomplete` event `final` makes once it is stored)."""
        out = b""
        output = self.output
        if self._message_index is not None:
            part = {"type": "output_text", "text": output.text, "annotations": []}
            index = self._message_index
            out += self._event("response.output_text.done", item_id=output.message_id,
                               output_index=index, content_index=0, text=output.text,
                               logprobs=[])
            out += self._event("response.content_part.done", item_id=output.message_id,
                               output_index=index, content_index=0, part=part)
            out += self._event("response.output_item.done", output_index=index,
                               item=output.items()[0])
        for call in output.calls.values():
            index = self._call_index[call.item_id]
            out += self._event("response.function_call_arguments.done", item_id=call.item_id,
                               output_index=index, name=call.name, arguments=call.arguments)
            out += self._event("response.output_item.done", output_index=index, item=call.item())
        status, incomplete = output.status()
        response = self._response(status, usage=output.response_usage(), incomplete=incomplete)
        return out, response

    def final(self, response: dict[str, Any]) -> bytes:
        """`response.completed` (or `response.incomplete`) carrying the whole response."""
        kind = "response.incomplete" if response["status"] == "incomplete" else \
            "response.completed"
        return self._event(kind, response=response)

    def failed(self, message: str, code: str = "server_error") -> bytes:
        """`response.failed`: the turn broke after the stream began."""
        error = {"code": code, "message": message}
        return self._event("response.failed", response=self._response("failed", error=error))
