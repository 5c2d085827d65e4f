"""What the replay client sends and how it reads the stream: OpenAI chat and completions.

`History` keeps one conversation's state between turns. The text sent with turn k+1 holds the
model's *actual* reply to turn k - never the dataset's reference answer - so the decode node's
prefix cache (and the proxy's session fingerprint) can match the history exactly.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Completions API rendering: a plain-text transcript. Turn k+1's prompt is turn k's prompt +
# the reply + the next user block, the proxy's completions continuation rule.
TURN_SEPARATOR = "\n\n"
USER_PREFIX = "User: "
ASSISTANT_PREFIX = "Assistant:"


class Api(enum.StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self is Api.CHAT else "/v1/completions"


@dataclass(slots=True)
class History:
    """One conversation's text so far, in the shape of the chosen API."""

    api: Api
    system: str | None
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt: str = ""

    def __post_init__(self) -> None:
        if self.system:
            self.messages.append({"role": "system", "content": self.system})
            self.prompt = self.system + TURN_SEPARATOR

    def add_user(self, text: str) -> None:
        """Append the next user turn."""
        self.messages.append({"role": "user", "content": text})
        opening = "" if self.prompt in ("", self.system_block) else TURN_SEPARATOR
        self.prompt += f"{opening}{USER_PREFIX}{text}{TURN_SEPARATOR}{ASSISTANT_PREFIX}"

    def add_reply(self, text: str) -> None:
        """Append the model's reply to the last user turn, exactly as it was streamed."""
        self.messages.append({"role": "assistant", "content": text})
        self.prompt += text

    @property
    def system_block(self) -> str:
        return self.system + TURN_SEPARATOR if self.system else ""

    def body(self, model: str, max_tokens: int, *, ignore_eos: bool) -> dict[str, Any]:
        """The request body for the current (last) user turn, streaming with usage."""
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


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one `data:` event of an OpenAI stream carries for the replay."""

    text: str
    usage: Mapping[str, Any] | None
    error: str | None


def parse_event(data: str) -> Chunk:
    """Parse one SSE `data:` payload (not `[DONE]`); a malformed payload is an error chunk."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return Chunk("", None, f"malformed stream event: {data[:80]!r}")
    if not isinstance(event, dict):
        return Chunk("", None, f"malformed stream event: {data[:80]!r}")
    if "error" in event:  # vLLM reports errors that happen mid-stream this way
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return Chunk("", None, f"stream error: {message}")
    text = ""
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        elif isinstance(choice.get("text"), str):
            text += choice["text"]
    usage = event.get("usage")
    return Chunk(text, usage if isinstance(usage, dict) else None, None)


def error_message(status: int, body: bytes) -> str:
    """A one-line message for a non-200 answer (OpenAI-shaped errors when possible)."""
    try:
        payload = json.loads(body)
        message = payload["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:200]
    return f"HTTP {status}: {message}"
