"""What the replay client sends: OpenAI chat and completions request bodies.

`History` keeps one conversation's state between turns. The text sent with turn k+1 holds the
model's *actual* reply to turn k - never the dataset's reference answer - so the decode node's
prefix cache (and the proxy's session fingerprint) can match the history exactly. Replies are
read with `proxy.completion` and go back into the history by its rule (the reply text, not the
reasoning), the rule the proxy's continuation check expects.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from proxy.completion import assistant_message

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
        """Append the model's reply text (its reasoning is not sent back), as streamed."""
        self.messages.append(assistant_message(text))
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


def error_message(status: int, body: bytes) -> str:
    """A one-line message for a non-200 answer (OpenAI-shaped errors when possible)."""
    try:
        payload = json.loads(body)
        message = payload["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:200]
    return f"HTTP {status}: {message}"
