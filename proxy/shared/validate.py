"""Request validation: what the proxy relies on (docs/architecture.md), before any backend is used.

Only what the proxy itself relies on is checked; every other field passes through to vLLM.
The body must be a JSON object that every later step can handle without surprises, so
`parse_json_object` is strict where Python's `json` is lenient:
- strict UTF-8 (no other encoding, no invalid bytes, no encoded surrogates) and no lone
  surrogate from a `\\ud800` escape in any string, key or value: such a string cannot be
  re-encoded to forward it;
- no `NaN`, `Infinity` or a number that overflows to infinity (`1e999`): not JSON, and vLLM
  would reject them after a P leg ran;
- integers of at most MAX_INT_DIGITS digits (Python refuses to parse more than 4300);
- nesting at most MAX_DEPTH deep (no field vLLM reads is nested deeper than a few levels).
"""

from __future__ import annotations

import enum
import hmac
import json
import math
import re
from typing import Any

import orjson

from proxy.shared.errors import BadRequest
from proxy.shared.json_codec import may_hold_huge_integer

MAX_DEPTH = 128
MAX_INT_DIGITS = 64  # a 64-bit seed has 20; anything longer is not a number vLLM takes


class Endpoint(enum.StrEnum):
    """The two completion endpoints; the value is the path both the proxy and vLLM serve."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


class _Rejected(ValueError):
    """A JSON value the proxy refuses (raised from the decoder's hooks)."""


def _reject_constant(name: str) -> Any:
    raise _Rejected(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Rejected(f"number {text[:32]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Rejected(f"integer with {len(text.lstrip('-'))} digits (at most "
                        f"{MAX_INT_DIGITS})")
    return int(text)


# orjson reads an integer beyond 64 bits as a float, which rounds to at least this magnitude
# (float(-2**63 - 1) == -2.0**63): a float outside the open interval may have been one.
_FLOAT_LOW, _FLOAT_HIGH = -(2.0**63), 2.0**64


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object that is safe to route and forward, or BadRequest.

    orjson first (the standard library with its hooks was 2.3% of the proxy's CPU per request,
    benchmarks/proxy_overhead): it refuses everything the hooks refuse - invalid UTF-8 and
    encoded surrogates, lone-surrogate escapes, NaN/Infinity, numbers that overflow to
    infinity - and reads every other document to the same value, except integers beyond 64
    bits, which it turns into floats (`_plain` sends a body holding such a float, and one
    nested too deep, the other way). Whatever orjson refuses goes through the standard
    library's path, so a refused body gets the same error either way."""
    try:
        fast = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(fast, dict) and (_plain_text(raw) or _plain(fast)):
            return fast
    return _parse_with_stdlib(raw)


def _plain_text(raw: bytes) -> bool:
    """`_plain` decided from the text alone when it can be, at C speed (walking the decoded
    body was 4% of the proxy's CPU per request): fewer brackets than MAX_DEPTH bound the
    nesting, and without 19 digits in a row no float came from a 64+-bit integer (a float
    literal reads the same in orjson and json; one that overflows orjson refuses). False
    means only: walk the body."""
    return (raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH
            and not may_hold_huge_integer(raw))


def _plain(root: dict[str, Any]) -> bool:
    """No nesting beyond MAX_DEPTH and no float that may have been a 64+-bit integer (orjson
    has checked the strings: valid Unicode)."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(root, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        for item in container.values() if isinstance(container, dict) else container:
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
            elif isinstance(item, float) and not _FLOAT_LOW < item < _FLOAT_HIGH:
                return False
    return True


def _parse_with_stdlib(raw: bytes) -> dict[str, Any]:
    """parse_json_object with the standard library and its hooks alone (the reference)."""
    try:
        text = raw.decode("utf-8")  # strict: invalid bytes and encoded surrogates fail here
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 ({exc.reason} at byte "
                         f"{exc.start})") from exc
    try:
        body = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except _Rejected as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest(f"request body is nested more than {MAX_DEPTH} levels deep") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    _check_tree(body)
    return body


def _check_tree(root: Any) -> None:
    """Depth and string checks without recursion (a deep body must not exhaust the stack)."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_string(value)
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise BadRequest(f"request body is nested more than {MAX_DEPTH} levels deep")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_string(key)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)


def _check_string(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"request body holds a lone surrogate (\\u{ord(text[exc.start]):04x}) "
                         "in a string; strings must be valid Unicode") from exc


def _shown(value: Any) -> str:
    """A value for an error message, cut short (the body may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_int_at_least_1(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    # bool is an int subclass in Python; JSON true is not a token count.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise BadRequest(f"'{name}' must be an integer >= 1, got {_shown(value)}", param=name)


# What a request may hold when no limit is given (ProxyConfig.limits.max_messages).
DEFAULT_MAX_MESSAGES = 10_000
# The fewest bytes a message takes (`{"role":"u"},`): a body shorter than this many per
# allowed message cannot hold too many, and is not scanned before it is parsed.
_MIN_MESSAGE_BYTES = 13


def refuse_many_messages(raw: bytes, max_messages: int) -> None:
    """BadRequest for a body that holds far more messages than allowed, before it is parsed
    (950k tiny messages parsed into ~190 MB of objects). Each message has a `"role"` key, so
    a body with more than 4x max_messages `"role"` strings in it is refused; one near the
    limit is counted exactly after parsing (`validate_body`). Free for ordinary bodies."""
    if len(raw) > _MIN_MESSAGE_BYTES * max_messages and raw.count(b'"role"') > 4 * max_messages:
        raise BadRequest(f"request body holds over {4 * max_messages} messages, over the limit "
                         f"of {max_messages} (--max-messages)", param="messages")


def validate_body(endpoint: Endpoint, body: dict[str, Any],
                  max_messages: int = DEFAULT_MAX_MESSAGES) -> None:
    """Raise BadRequest unless body carries what the proxy needs for this endpoint.

    max_messages bounds the work one request causes (a digest per message prefix, a token
    count per message): 950k tiny messages blocked the event loop for seconds."""
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list", param="messages")
        if len(messages) > max_messages:
            raise BadRequest(f"'messages' holds {len(messages)} messages, over the limit of "
                             f"{max_messages} (--max-messages)", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'",
                                 param=f"messages[{i}]")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise BadRequest("'prompt' must be a string or a list", param="prompt")
        if isinstance(prompt, list) and len(prompt) > max_messages \
                and not isinstance(prompt[0], int):
            # A batch of prompts costs like messages; a list of token ids is one prompt (vLLM
            # takes no mixed list: the first item says which).
            raise BadRequest(f"'prompt' is a batch of {len(prompt)} prompts, over the limit of "
                             f"{max_messages} (--max-messages)", param="prompt")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest(f"'stream' must be a boolean, got {_shown(body['stream'])}",
                         param="stream")
    _check_int_at_least_1(body, "max_tokens")
    _check_int_at_least_1(body, "max_completion_tokens")
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("'model' must be a string", param="model")
    conversation_id = body.get("conversation_id")
    if conversation_id is not None and not isinstance(conversation_id, str | int):
        raise BadRequest("'conversation_id' must be a string", param="conversation_id")
    if conversation_id is not None:
        check_session_id(str(conversation_id), "conversation_id")


# A session id is echoed in the x-ppd-session header: past this length, or with control
# characters (CR/LF, NUL...), common clients could not read the answer's headers.
MAX_SESSION_ID_CHARS = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_session_id(value: str, param: str) -> None:
    """Raise BadRequest unless a client-chosen session id fits in a response header."""
    if len(value) > MAX_SESSION_ID_CHARS:
        raise BadRequest(f"'{param}' is {len(value)} characters, over the limit of "
                         f"{MAX_SESSION_ID_CHARS}", param=param)
    if _CONTROL.search(value):
        raise BadRequest(f"'{param}' holds a control character (CR, LF, NUL...), which a "
                         "response header cannot carry", param=param)


def bearer_matches(header: str | None, *keys: str | None) -> bool:
    """Whether an Authorization header carries one of the keys (constant-time compare)."""
    token = header[7:] if header and header.lower().startswith("bearer ") else None
    return token is not None and any(
        k is not None and hmac.compare_digest(token.encode(), k.encode()) for k in keys)
