"""vLLM's OpenAI API shapes for an emulated node: parsing a request, building answers (pure).

Mirrors what vLLM's OpenAI server does with the fields ppd and common clients send: chat
messages or a completions prompt (text, token ids, or a one-element list of either),
max_tokens / max_completion_tokens (default: what is left of the context), stream and
stream_options.include_usage, kv_transfer_params. Sampling fields are accepted and ignored
(the text is synthetic). Replies end with finish_reason "length": the model has no EOS.

`Envelope` is the one encoder of vLLM's answers in the repository: the emulated nodes, the
test fakes (tests/fakes) and the proxy benchmark's backend all write their JSON answers and
SSE events with it, so a change of the wire format is one edit here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

# Where vLLM's reasoning parsers put the thinking (newer vLLM also writes `reasoning`).
REASONING_FIELD = "reasoning_content"


class RequestError(Exception):
    """The client's request is invalid: answered with status and an OpenAI-style error."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.status}}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the node needs from a completion request."""

    chat: bool
    model: str
    messages: list[dict[str, Any]] | None
    prompt_text: str | None
    prompt_ids: list[int] | None
    max_tokens: int | None
    stream: bool
    include_usage: bool
    kv_transfer_params: dict[str, Any] | None
    session_id: str | None = None  # vLLM >= 0.32 tags the request's KV cache events with it
    return_token_ids: bool = False  # a whole answer also carries the prompt's and reply's ids

    @property
    def wants_remote_decode(self) -> bool:
        """A P leg: prefill, keep the KV for a remote D and return its kv_transfer_params."""
        return bool((self.kv_transfer_params or {}).get("do_remote_decode"))

    @property
    def reads_back(self) -> bool:
        """A readback P leg: the params are a D's, naming blocks to read the history from."""
        kv = self.kv_transfer_params or {}
        return self.wants_remote_decode and bool(kv.get("remote_block_ids")) and bool(
            kv.get("remote_engine_id"))

    @property
    def wants_remote_prefill(self) -> bool:
        """A D leg: the prompt's KV is to be pulled from the P named in kv_transfer_params."""
        return bool((self.kv_transfer_params or {}).get("do_remote_prefill"))


def parse(body: Any, chat: bool) -> Parsed:
    """Validate a request body as vLLM would (400 on anything it rejects)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", param="model")
    messages = prompt_text = prompt_ids = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise RequestError("messages must be a non-empty list of objects with a role",
                               param="messages")
    else:
        prompt_text, prompt_ids = _prompt(body.get("prompt"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
            max_tokens, int) or max_tokens < 1):
        raise RequestError("max_tokens must be an integer of at least 1", param="max_tokens")
    n = body.get("n", 1)
    if n != 1:
        raise RequestError("emulated nodes generate one choice (n=1)", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise RequestError("kv_transfer_params must be an object", param="kv_transfer_params")
    session = body.get("session_id")
    if session is not None and not isinstance(session, str):
        raise RequestError("session_id must be a string", param="session_id")
    return Parsed(chat, model or "", messages, prompt_text, prompt_ids, max_tokens, stream,
                  bool(isinstance(options, dict) and options.get("include_usage")), kv, session,
                  body.get("return_token_ids") is True)


def _prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one, as clients often send
    if isinstance(prompt, str) and prompt:
        return prompt, None
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return None, list(prompt)
    raise RequestError("prompt must be a non-empty string or list of token ids (one prompt)",
                       param="prompt")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None
          ) -> dict[str, Any]:
    """vLLM's usage block; prompt_tokens_details only when the node reports it."""
    details = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": details}


@dataclass(frozen=True, slots=True)
class Envelope:
    """The fields every answer of one request shares."""

    request_id: str
    model: str
    chat: bool
    created: int

    @classmethod
    def new(cls, request_id: str, model: str, chat: bool) -> Envelope:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(f"{prefix}-{request_id}", model, chat, int(time.time()))

    def _base(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else "")
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model}  # fmt: skip

    def complete(self, text: str, finish_reason: str, usage_block: dict[str, Any],
                 kv_transfer_params: dict[str, Any] | None, reasoning: str | None = None,
                 reasoning_field: str = REASONING_FIELD) -> dict[str, Any]:
        """A non-streamed answer (chat: with the reasoning, if any, in reasoning_field)."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason,
                                  "stop_reason": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
            if reasoning is not None:
                choice["message"][reasoning_field] = reasoning
        else:
            choice["text"] = text
        return {**self._base(False), "choices": [choice], "usage": usage_block,
                "kv_transfer_params": kv_transfer_params}

    def chunk(self, text: str | None, finish_reason: str | None = None,
              role: bool = False) -> bytes:
        """One SSE event with a text delta (or the role, or the finish reason)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {} if text is None else {"content": text})
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason, "stop_reason": None}
        return sse({**self._base(True), "choices": [choice]})

    def reasoning_chunk(self, text: str, reasoning_field: str = REASONING_FIELD) -> bytes:
        """One SSE event of a chat stream's reasoning (vLLM with a reasoning parser streams the
        thinking first, in its own delta field)."""
        choice = {"index": 0, "delta": {reasoning_field: text}, "logprobs": None,
                  "finish_reason": None}
        return sse({**self._base(True), "choices": [choice]})

    def usage_chunk(self, usage_block: dict[str, Any]) -> bytes:
        return sse({**self._base(True), "choices": [], "usage": usage_block})


def sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


DONE = b"data: [DONE]\n\n"

