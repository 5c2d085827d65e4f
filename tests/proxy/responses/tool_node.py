"""A fake vLLM node that calls a tool when `tool_choice` names one (as vLLM's structured
output makes the model do): its answer's `tool_calls` hold one call of that function."""

from __future__ import annotations

import json
from typing import Any

from quart import Response, request

from profiler.emulate.openai_format import DONE
from tests.fakes.fake_vllm import FakeVLLM, Recorded

ARGUMENTS = '{"city": "Paris"}'


class ToolNode(FakeVLLM):
    """FakeVLLM, plus named tool calls (streamed as vLLM streams them, or whole)."""

    async def _complete(self, chat: bool) -> Response:
        body = await request.get_json()
        choice = body.get("tool_choice")
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if not named or (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            request_body = body
            return await self._answer(request_body, chat)
        self.requests.append(Recorded(request.path, body, {}))
        call = {"id": f"call_{len(self.requests)}", "type": "function",
                "function": {"name": named, "arguments": ARGUMENTS}}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        base = {"id": "chatcmpl-tool", "created": 0, "model": self.model}
        if not body.get("stream"):
            return Response(json.dumps({**base, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "",
                                         "tool_calls": [call]}, "finish_reason": "tool_calls"}],
                "usage": usage}), content_type="application/json")
        head = {**call, "index": 0, "function": {"name": named, "arguments": ""}}
        pieces = [head, {"index": 0, "function": {"arguments": ARGUMENTS[:8]}},
                  {"index": 0, "function": {"arguments": ARGUMENTS[8:]}}]

        def event(delta: dict[str, Any], finish: str | None = None,
                  extra: dict[str, Any] | None = None) -> bytes:
            chunk = {**base, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish}], **(extra or {})}
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        async def events() -> Any:
            yield event({"role": "assistant", "content": ""})
            for piece in pieces:
                yield event({"tool_calls": [piece]})
            yield event({}, "tool_calls")
            yield (b"data: " + json.dumps({**base, "object": "chat.completion.chunk",
                                           "choices": [], "usage": usage}).encode() + b"\n\n")
            yield DONE

        return Response(events(), content_type="text/event-stream")

    async def _answer(self, body: dict[str, Any], chat: bool) -> Response:
        return await super()._complete(chat)
