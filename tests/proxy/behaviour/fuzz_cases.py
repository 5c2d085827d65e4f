"""Fuzzing the proxy's HTTP surface: hypothesis strategies for hostile requests and the one
property every answer must have. Shared by tests/proxy/behaviour/test_fuzz.py and
benchmarks/fuzz.py.

A case is (method, path, headers, body bytes). Bodies come from four families:
- valid: a body the proxy must serve, with odd but legal text and session ids;
- structured: a completion body where every field the proxy or vLLM reads (messages, content
  parts, tools, n, logprobs, stream, max_tokens, temperature, prompt as text or token ids,
  conversation_id, kv_transfer_params, ...) is sometimes right, sometimes of a wrong type;
- mutated: a structured body serialized and then damaged at the byte or token level
  (invalid UTF-8, UTF-16, encoded or escaped lone surrogates, NaN / Infinity / 1e999, a
  5000-digit integer, deep nesting, truncation, a huge history);
- raw: arbitrary bytes.

The property (`check_answer`): the proxy answers every case with a 4xx carrying an OpenAI error
body, or with a valid completion (a JSON document with choices, or an SSE stream that ends
with `data: [DONE]`); never a 5xx, never a malformed answer, and it stays up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from quart.typing import TestClientProtocol

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, create_app
from proxy.config.policy_config import Policy
from tests.fakes.mock_vllm import MODEL, MockCluster

ADMIN_KEY = "fuzz-admin"
PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True)
class Case:
    """One request to throw at the proxy."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def __repr__(self) -> str:  # hypothesis prints the falsifying case
        return (f"Case({self.method} {self.path} headers={self.headers!r} "
                f"body={self.body[:400]!r}{'...' if len(self.body) > 400 else ''})")


# ---- values -----------------------------------------------------------------------------

# Text with the characters that break naive code: controls, quotes, backslashes, astral ones.
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=24)
_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | _text)
_any_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(_text, inner, max_size=4), max_leaves=12)
_counts = st.integers(-3, 40) | st.sampled_from([0, 2**63, -(2**63)]) | _any_json

_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "bogus"]) | _any_json},
    optional={"text": _text | _any_json, "image_url": _any_json})
_content = _text | st.none() | st.lists(_part, max_size=3) | _any_json
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | _any_json},
    optional={"content": _content, "name": _text | _any_json, "tool_calls": _any_json,
              "tool_call_id": _any_json})
_messages = st.lists(_message, min_size=1, max_size=6) | _any_json
_tool = st.fixed_dictionaries({"type": st.just("function") | _any_json, "function": st.one_of(
    st.fixed_dictionaries({"name": _text, "parameters": _any_json}), _any_json)})
_token_ids = st.lists(st.integers(0, 50_000), min_size=1, max_size=16)
_prompt = (_text | _token_ids | st.lists(_token_ids, min_size=1, max_size=3)
           | st.lists(_text, min_size=1, max_size=3) | _any_json)

# Session ids that must survive the trip back in the x-ppd-session header.
_odd_ids = st.sampled_from(["a\r\nx-evil: 1", "\U0001F600", "caf\u00e9", "%41", "tab\tnul\x00"])

_optional_fields: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just(MODEL) | _text | _any_json,
    "stream": st.booleans() | _any_json,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | _any_json})
    | _any_json,
    "max_tokens": st.integers(1, 12) | _counts,
    "max_completion_tokens": st.integers(1, 12) | _counts,
    "temperature": st.floats(0, 2) | _any_json,
    "top_p": st.floats(0, 1) | _any_json,
    "n": _counts,
    "logprobs": st.booleans() | _counts,
    "top_logprobs": _counts,
    "seed": _counts,
    "stop": _text | st.lists(_text, max_size=3) | _any_json,
    "tools": st.lists(_tool, max_size=2) | _any_json,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | _any_json,
    "response_format": _any_json,
    "conversation_id": _odd_ids | _text | st.integers() | _any_json,
    "kv_transfer_params": _any_json,
    "user": _text | _any_json,
}


@st.composite
def completion_bodies(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A completion body for path: required fields usually right, the rest anything."""
    required = "messages" if path.endswith("chat/completions") else "prompt"
    body: dict[str, Any] = {}
    if draw(st.integers(0, 9)):  # one body in ten lacks its required field
        body[required] = draw(_messages if required == "messages" else _prompt)
    body.update(draw(st.fixed_dictionaries({}, optional=_optional_fields)))
    body.update(draw(st.dictionaries(_text, _any_json, max_size=2)))
    return body


@st.composite
def valid_bodies(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """A body the proxy must serve (200): odd but legal text, ids, stream or not."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": draw(st.integers(1, 8)),
                            "stream": draw(st.booleans())}
    if path.endswith("chat/completions"):
        body["messages"] = draw(st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant"]), "content": _text}),
            min_size=1, max_size=4))
    else:
        body["prompt"] = draw(_text | _token_ids)
    if draw(st.booleans()):
        body["conversation_id"] = draw(_odd_ids | _text)
    return body


# ---- damage -------------------------------------------------------------------------------

_POISON = [
    b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"9" * 5000, b'"\\ud800"',
    b'"\\udfff x"', b'"\xed\xa0\x80"', b'"\xff\xfe"', b'"\xc0\xaf"', b"\x00", b'"a\\u0000b"',
    b"[" * 130 + b"]" * 130, b"{\"a\":" * 200 + b"1" + b"}" * 200, b"[" * 100_000,
    b"true", b"null", b"{}", b"[]", b'"' + b"x" * 70_000 + b'"',
]


@st.composite
def damaged(draw: st.DrawFn, raw: bytes) -> bytes:
    """raw with one kind of damage applied."""
    how = draw(st.sampled_from(["poison_value", "insert_bytes", "truncate", "utf16",
                                "wrap_deep", "huge_history", "flip_byte"]))
    if how == "poison_value":
        # Replace a value (after some ':' or ',' or '[') with a poisonous token.
        spots = [i + 1 for i, b in enumerate(raw) if b in b":,["] or [len(raw)]
        at = draw(st.sampled_from(spots))
        end = at
        while end < len(raw) and raw[end] not in b",]}":
            end += 1
        return raw[:at] + draw(st.sampled_from(_POISON)) + raw[end:]
    if how == "insert_bytes":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.binary(min_size=1, max_size=6)) + raw[at:]
    if how == "truncate":
        return raw[:draw(st.integers(0, max(len(raw) - 1, 0)))]
    if how == "utf16":
        return raw.decode("utf-8", "surrogatepass").encode(draw(st.sampled_from(
            ["utf-16", "utf-16-le", "utf-32"])), "surrogatepass")
    if how == "wrap_deep":
        depth = draw(st.integers(100, 3000))
        return b'{"x":' + b"[" * depth + raw + b"]" * depth + b"}"
    if how == "huge_history":
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20}
                 for i in range(draw(st.integers(200, 3000)))]
        return json.dumps({"model": MODEL, "messages": turns, "max_tokens": 2}).encode()
    if not raw:
        return b"\x80"
    at = draw(st.integers(0, len(raw) - 1))
    return raw[:at] + bytes([draw(st.integers(0x80, 0xFF))]) + raw[at + 1:]


def _serialize(body: dict[str, Any], ascii_only: bool) -> bytes:
    return json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


_latin1 = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40)
_headers = st.fixed_dictionaries({}, optional={
    "x-session-id": _latin1,
    "x-ppd-route": st.sampled_from(["pd", "local", "replica", "", "PD"]) | _latin1,
    "authorization": st.sampled_from([f"Bearer {ADMIN_KEY}", "Bearer wrong", "Basic x", ""])
    | _latin1,
    "content-type": st.sampled_from(["application/json", "text/plain", "application/x-www-form-"
                                     "urlencoded", "multipart/form-data; boundary=x"]),
    "host": st.sampled_from(["evil.example:80", "d1", "127.0.0.1:1"]),
    "x-forwarded-host": st.sampled_from(["evil.example", "p1"]),
    "content-encoding": st.sampled_from(["gzip", "br", "identity"]),
})


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Any request: a valid, structured, mutated or raw body on a completion endpoint."""
    path = draw(st.sampled_from(PATHS))
    family = draw(st.sampled_from(["valid", "structured", "structured", "mutated", "mutated",
                                   "raw"]))
    if family == "raw":
        body = draw(st.binary(max_size=200))
    elif family == "valid":
        body = _serialize(draw(valid_bodies(path)), draw(st.booleans()))
    else:
        body = _serialize(draw(completion_bodies(path)), draw(st.booleans()))
        if family == "mutated":
            body = draw(damaged(body))
    method = draw(st.sampled_from(["POST"] * 30 + ["GET", "PUT"]))
    return Case(method, path, draw(_headers), body)


# ---- the property ---------------------------------------------------------------------------

class AnswerError(AssertionError):
    """The proxy answered a case in a way the contract forbids."""


def check_answer(status: int, content_type: str, body: bytes) -> None:
    """Raise AnswerError unless (status, body) is a clean 4xx or a valid completion."""
    if status >= 500:
        raise AnswerError(f"proxy answered {status}: {body[:300]!r}")
    if status >= 400:
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError) as exc:
            raise AnswerError(f"{status} without an OpenAI error body: {body[:300]!r}") from exc
        if not (isinstance(error, dict) and isinstance(error.get("message"), str)
                and isinstance(error.get("type"), str) and "code" in error):
            raise AnswerError(f"{status} with a malformed error: {error!r}")
        return
    if status != 200:
        raise AnswerError(f"unexpected status {status}")
    if content_type.startswith("text/event-stream"):
        events = [e for e in body.decode().split("\n\n") if e.strip()]
        if not events or events[-1] != "data: [DONE]":
            raise AnswerError(f"stream does not end with [DONE]: {body[-300:]!r}")
        for event in events[:-1]:
            if "error" in json.loads(event.removeprefix("data: ")):
                raise AnswerError(f"error event in a 200 stream: {event[:300]!r}")
        return
    if not isinstance(json.loads(body).get("choices"), list):
        raise AnswerError(f"200 without choices: {body[:300]!r}")


# ---- the proxy under fuzz -----------------------------------------------------------------

@dataclass
class FuzzTarget:
    """The proxy app in process over mock nodes, driven from synchronous code."""

    runner: asyncio.Runner
    client: TestClientProtocol
    cluster: MockCluster
    answered: dict[int, int] = field(default_factory=dict)

    def send(self, case: Case) -> tuple[int, str, bytes]:
        """Send one case; (status, content type, body)."""
        return self.runner.run(self._send(case))

    async def _send(self, case: Case) -> tuple[int, str, bytes]:
        response = await self.client.open(case.path, method=case.method, data=case.body,
                                          headers=case.headers)
        body = await response.get_data(as_text=False)
        self.answered[response.status_code] = self.answered.get(response.status_code, 0) + 1
        return response.status_code, response.content_type or "", body  # type: ignore[return-value]

    def check(self, case: Case) -> None:
        """Send case and assert the property."""
        check_answer(*self.send(case))

    def in_flight(self) -> dict[str, int]:
        """Every node's in-flight count and the proxy's open requests: all 0 when idle."""
        state = self.client.app.extensions["ppd"]  # type: ignore[attr-defined]
        counts = {n.url: n.in_flight for n in state.pool.nodes()}
        return {**counts, "admitted": state.router.admission.open}


@contextmanager
def fuzz_target(policy: Policy = Policy.LOCAL) -> Iterator[FuzzTarget]:
    """A started proxy (two P, two D mock nodes, an admin key) on its own event loop."""
    cluster = MockCluster("p1", "p2", "d1", "d2")
    nodes = tuple(NodeSpec(node.url, Role.PREFILL if name[0] == "p" else Role.DECODE)
                  for name, node in cluster.nodes.items())
    config = ProxyConfig(nodes=nodes, policy=PolicyConfig(policy), port=0, health_interval=600,
                         admin_key=ADMIN_KEY, max_body_bytes=1024 * 1024)
    app = create_app(config, transport=cluster.transport)
    with asyncio.Runner() as runner:
        test_app = app.test_app()
        runner.run(test_app.startup())
        try:
            yield FuzzTarget(runner, test_app.test_client(), cluster)
        finally:
            runner.run(test_app.shutdown())
