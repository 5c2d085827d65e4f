"""What the replay client sends: OpenAI chat, completions and Responses request bodies.

`History` keeps one conversation's state between turns. The text sent with turn k+1 holds the
model's *actual* reply to turn k - never the dataset's reference answer - so the decode node's
prefix cache (and the proxy's session fingerprint) can match the history exactly. Replies are
read with `proxy.shared.completion` and go back into the history by its rule (the reply text, not
the
reasoning), the rule the proxy's continuation check expects. Through the Responses API
(`--api responses`) a turn sends only its new user text and names the previous response
(`previous_response_id`): the server holds the history (docs/responses.md).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from proxy.shared.completion import assistant_message

# Completions API rendering: a plain-text transcript. Turn k+1's prompt is turn k's prompt +
# the reply + the next user block, the proxy's completions continuation rule.
TURN_SEPARATOR = "\n\n"
USER_PREFIX = "User: "
ASSISTANT_PREFIX = "Assistant:"


class Api(enum.StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"

    @property
    def path(self) -> str:
        return _PATHS[self]


_PATHS = {Api.CHAT: "/v1/chat/completions", Api.COMPLETIONS: "/v1/completions",
          Api.RESPONSES: "/v1/responses"}


@dataclass(slots=True)
class History:
    """One conversation's text so far, in the shape of the chosen API."""

    api: Api
    system: str | None
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt: str = ""
    previous_response_id: str | None = None  # the Responses API's: the last reply's id

    def __post_init__(self) -> None:
        if self.system:
            self.messages.append({"role": "system", "content": self.system})
            self.prompt = self.system + TURN_SEPARATOR

    def add_user(self, text: str) -> None:
        """Append the next user turn."""
        self.messages.append({"role": "user", "content": text})
        opening = "" if self.prompt in ("", self.system_block) else TURN_SEPARATOR
        self.prompt += f"{opening}{USER_PREFIX}{text}{TURN_SEPARATOR}{ASSISTANT_PREFIX}"

    def add_reply(self, text: str, response_id: str | None = None) -> None:
        """Append the model's reply text (its reasoning is not sent back), as streamed, and
        (the Responses API) the id of the response that holds it."""
        self.messages.append(assistant_message(text))
        self.prompt += text
        self.previous_response_id = response_id

    @property
    def system_block(self) -> str:
        return self.system + TURN_SEPARATOR if self.system else ""

    def body(self, model: str, max_tokens: int, *, ignore_eos: bool) -> dict[str, Any]:
        """The request body for the current (last) user turn, streaming with usage."""
        if self.api is Api.RESPONSES:
            return self._responses_body(model, max_tokens, ignore_eos=ignore_eos)
        body: dict[str, Any] = {"model": model}
        if self.api is Api.CHAT:
            body["messages"] = [dict(message) for message in self.messages]
        else:
            body["prompt"] = self.prompt
        body.update(
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        if ignore_eos:
            body["ignore_eos"] = True  # vLLM extension: generate exactly max_tokens
        return body

    def _responses_body(self, model: str, max_tokens: int, *,
                        ignore_eos: bool) -> dict[str, Any]:
        """The new user text, naming the previous response; instructions every turn (OpenAI
        does not carry them over a previous_response_id)."""
        body: dict[str, Any] = {"model": model, "input": self.messages[-1]["content"],
                                "max_output_tokens": max_tokens, "stream": True}
        if self.previous_response_id is not None:
            body["previous_response_id"] = self.previous_response_id
        if self.system:
            body["instructions"] = self.system
        if ignore_eos:
            body["ignore_eos"] = True
        return body


def error_message(status: int, body: bytes) -> str:
    """A one-line message for a non-200 answer (OpenAI-shaped errors when possible)."""
    try:
        payload = json.loads(body)
        message = payload["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:200]
    return f"HTTP {status}: {message}"


@dataclass(frozen=True, slots=True)
class ResponsesDelta:
    """What one Responses API payload (a stream event, or a whole response) says."""

    text: str = ""
    usage: dict[str, Any] | None = None  # as chat names it: prompt_tokens, completion_tokens
    response_id: str | None = None
    error: str | None = None
    done: bool = False


def parse_responses_payload(payload: Any) -> ResponsesDelta:
    """A Responses stream event's data, or a whole `response` object."""
    if not isinstance(payload, dict):
        return ResponsesDelta(error=f"malformed Responses payload: {str(payload)[:80]!r}")
    kind = payload.get("type")
    if kind == "response.output_text.delta":
        return ResponsesDelta(text=str(payload.get("delta") or ""))
    if kind in ("response.failed", "error"):
        error = (payload.get("response") or {}).get("error") or payload.get("error") or payload
        message = error.get("message") if isinstance(error, dict) else error
        return ResponsesDelta(error=f"upstream error: {message}")
    if kind is not None and kind not in ("response.completed", "response.incomplete"):
        return ResponsesDelta()
    response = payload.get("response", payload)  # a final event, or a whole response
    usage = response.get("usage") if isinstance(response, dict) else None
    text = "".join(part.get("text", "") for item in response.get("output") or ()
                   if item.get("type") == "message" for part in item.get("content") or ())
    chat_usage = ({"prompt_tokens": usage.get("input_tokens"),
                   "completion_tokens": usage.get("output_tokens")}
                  if isinstance(usage, dict) else None)
    return ResponsesDelta(text if kind is None else "", chat_usage, response.get("id"),
                          done=True)
