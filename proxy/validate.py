"""Request validation: what the proxy relies on (docs/architecture.md), before any backend is used.

Only what the proxy itself relies on is checked; every other field passes through to vLLM.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from proxy.errors import BadRequest


class Endpoint(enum.StrEnum):
    """The two completion endpoints; the value is the path both the proxy and vLLM serve."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _check_int_at_least_1(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    # bool is an int subclass in Python; JSON true is not a token count.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise BadRequest(f"'{name}' must be an integer >= 1, got {value!r}")


def validate_body(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """Raise BadRequest unless body carries what the proxy needs for this endpoint."""
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise BadRequest("'prompt' must be a string or a list")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest(f"'stream' must be a boolean, got {body['stream']!r}")
    _check_int_at_least_1(body, "max_tokens")
    _check_int_at_least_1(body, "max_completion_tokens")
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("'model' must be a string")
    conversation_id = body.get("conversation_id")
    if conversation_id is not None and not isinstance(conversation_id, str | int):
        raise BadRequest("'conversation_id' must be a string")
