"""A streamed reply reaches the client byte for byte as the node sent it, on both routes.

The node below is a bare ASGI app that writes a fixed body in awkward pieces: an event split
across writes, a UTF-8 character split across writes, two events in one write, a CRLF-framed
event, non-ASCII text. Turn 1 goes P->D, turn 2 (a continuation) runs locally on that D; each
client body must equal the node's bytes exactly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, running
from proxy.config.policy_config import Policy
from tests.proxy.helpers import reply_text, serve_proxy


def _event(payload: dict[str, Any], end: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + end


def _delta(text: str) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


BODY = b"".join([
    _event({"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "finish_reason": None}]}),
    _event(_delta("Grüße, ")),
    _event(_delta("naïve ✓ "), end=b"\r\n\r\n"),
    _event(_delta("日本")),
    _event({"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    _event({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}}),
    b"data: [DONE]\n\n",
])
REPLY = "Grüße, naïve ✓ 日本"
# Cut points: inside an event, inside "ü" and "✓" (multi-byte), two events in one write.
_CUTS = (9, BODY.index("ü".encode()) + 1, BODY.index("✓".encode()) + 2, len(BODY) - 30)
PIECES = [BODY[a:b] for a, b in zip((0, *_CUTS), (*_CUTS, len(BODY)), strict=True)]


class ByteNode:
    """A fake vLLM node (P and D) that streams exactly PIECES."""

    def __init__(self) -> None:
        self.completions = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] != "/v1/chat/completions":
            await _send(send, 200, b"{}", b"application/json")
            return
        self.completions += 1
        request = json.loads(body)
        if (request.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer = {"choices": [{"index": 0, "message": {"content": "G"}}],
                      "kv_transfer_params": {"remote_engine_id": "e"}}
            await _send(send, 200, json.dumps(answer).encode(), b"application/json")
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for piece in PIECES:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _nodes() -> AsyncIterator[tuple[str, str, ByteNode]]:
    node = ByteNode()
    async with running(node) as p, running(node) as d:
        yield p.url, d.url, node


async def test_streamed_bytes_equal_the_nodes_on_both_routes() -> None:
    async with _nodes() as (p_url, d_url, node):
        config = ProxyConfig(nodes=(NodeSpec(p_url, Role.PREFILL), NodeSpec(d_url, Role.DECODE)),
                             policy=PolicyConfig(Policy.LOCAL), port=0, health_interval=60.0)
        async with serve_proxy(config) as proxy:
            messages = [{"role": "user", "content": "Bonjour, ça va ?"}]
            bodies, routes = [], []
            for turn in range(2):
                request = {"model": "m", "messages": messages, "stream": True,
                           "stream_options": {"include_usage": True}}
                async with proxy.client.stream("POST", "/v1/chat/completions",
                                               json=request) as response:
                    assert response.status_code == 200
                    body = b"".join([chunk async for chunk in response.aiter_raw()])
                bodies.append(body)
                routes.append(response.headers["x-ppd-route"])
                reply = reply_text(httpx.Response(200, content=body.replace(b"\r\n", b"\n"),
                                                  headers=response.headers))
                messages = [*messages, {"role": "assistant", "content": reply},
                            {"role": "user", "content": f"encore {turn}"}]
    assert routes == ["pd", "local"]
    assert bodies == [BODY, BODY]
    assert reply == REPLY
    assert node.completions == 3  # P and D for turn 1, D alone for turn 2
