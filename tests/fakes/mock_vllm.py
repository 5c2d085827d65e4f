"""Fake vLLM nodes behind an `httpx.MockTransport`: no sockets, faults scripted per request.

    cluster = MockCluster("p1", "d1", "d2")            # http://p1, http://d1, http://d2
    cluster["d1"].script(Fault.status(503), Fault.reset())  # its next two completions fail
    client = httpx.AsyncClient(transport=cluster.transport)
    cluster["d1"].received           # completion requests that reached d1 (body, headers)
    cluster.request_ids()            # Counter of (node, X-Request-Id) over every reception

Each node answers /health, /v1/models and both completion endpoints like `FakeVLLM` (a P leg,
`kv_transfer_params.do_remote_decode`, gets kv_transfer_params back; SSE when streamed); its
reply text names it; P's kv_transfer_params carry the X-Request-Id of the prefill that made
them (`remote_request_id`). A refused connection never reaches the node, so it is not received.

With `keeps_readback`, a D answers a whole P->D leg as vLLM's bidirectional NIXL does: its
kv_transfer_params name blocks holding the prompt and all but the last reply token
(`remote_num_tokens`), and `return_token_ids` adds the ids. `/tokenize` renders a chat (role
marker, one id per word of content, end marker; the generation prompt) with `fake_ids`, the
one fake tokenizer both sides use; `reply_ids` replaces a reply's own ids (a reply that
re-tokenizes into other ids).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from profiler.emulate.openai_format import DONE, Envelope, usage

MODEL = "fake-model"
# Fake tokenizer ids of the chat markers.
_ROLE_IDS = {"system": 1, "user": 2, "assistant": 3}
_END_ID = 4


def fake_ids(text: str) -> list[int]:
    """One stable id per whitespace-separated word (the mock's tokenizer)."""
    return [10 + zlib.crc32(word.encode()) % 50000 for word in text.split()]


def fake_chat_ids(messages: list[dict[str, Any]], generation_prompt: bool = True) -> list[int]:
    """A chat rendered and tokenized as the mock nodes do."""
    ids: list[int] = []
    for message in messages:
        # The fuzz sends messages without content, or with parts: a tokenizer takes the text.
        content = message.get("content") if isinstance(message, dict) else None
        text = content if isinstance(content, str) else json.dumps(content) if content else ""
        role = message.get("role") if isinstance(message, dict) else None
        ids += [_ROLE_IDS.get(role, 5) if isinstance(role, str) else 5, *fake_ids(text), _END_ID]
    return ids + [_ROLE_IDS["assistant"]] if generation_prompt else ids


@dataclass(frozen=True, slots=True)
class Fault:
    """What a node does with one completion request (`ok` answers normally)."""

    kind: str = "ok"
    status_code: int = 0
    chunks: int = 0  # die_after: body chunks sent before the connection dies

    @staticmethod
    def status(code: int) -> Fault:
        """Answer with this status and an OpenAI error body."""
        return Fault("status", status_code=code)

    @staticmethod
    def refuse() -> Fault:
        """Refuse the connection (the request never reaches the node)."""
        return Fault("refuse")

    @staticmethod
    def reset() -> Fault:
        """Receive the request, then drop the connection before any response byte."""
        return Fault("reset")

    @staticmethod
    def timeout() -> Fault:
        """Receive the request and never answer in time (httpx's read timeout fires)."""
        return Fault("timeout")

    @staticmethod
    def die_after(chunks: int) -> Fault:
        """Answer 200, send this many body chunks, then drop the connection."""
        return Fault("die_after", chunks=chunks)

    @staticmethod
    def garbage() -> Fault:
        """Answer 200 with a body that is not JSON (a broken node or a foreign server)."""
        return Fault("garbage")

    @staticmethod
    def endless() -> Fault:
        """Stream far past max_tokens (a runaway D): a thousand more events before [DONE]."""
        return Fault("endless")

    @staticmethod
    def hang() -> Fault:
        """Receive the request and never answer (until the caller gives up)."""
        return Fault("hang")


@dataclass(frozen=True, slots=True)
class Received:
    """One completion request as a node received it."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(eq=False)
class MockNode:
    """One fake node: its script of faults, what it received, what it served."""

    name: str
    kv_params: dict[str, Any] | None = None
    health_status: int = 200
    delay_s: float = 0.0  # every completion waits this long first (a slow node)
    received: list[Received] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    cancelled: int = 0  # requests or streams the caller abandoned
    finished: int = 0  # streams sent to the end
    open: int = 0  # requests being served right now
    keeps_readback: bool = False  # a D with vLLM's bidirectional_kv_xfer on
    reply_ids: list[int] | None = None  # the ids a reply reports (default: its words' ids)

    def __post_init__(self) -> None:
        if self.kv_params is None:
            self.kv_params = {"do_remote_prefill": True, "do_remote_decode": False,
                              "remote_engine_id": f"engine-{self.name}",
                              "remote_block_ids": [1, 2, 3], "remote_host": "10.0.0.1",
                              "remote_port": 5600}

    @property
    def url(self) -> str:
        """The node's base URL."""
        return f"http://{self.name}"

    def script(self, *faults: Fault) -> None:
        """The next completions do these, in order; later ones answer normally."""
        self.faults.extend(faults)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request."""
        if request.url.path == "/health":
            return httpx.Response(self.health_status)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL}]})
        fault = self.faults.pop(0) if self.faults else Fault()
        if fault.kind == "refuse":
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content)
        self.received.append(Received(request.url.path, body,
                                      {k.lower(): v for k, v in request.headers.items()}))
        self.open += 1
        try:
            return await self._answer(request, body, fault)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.open -= 1

    async def _answer(self, request: httpx.Request, body: dict[str, Any],
                      fault: Fault) -> httpx.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if fault.kind == "hang":
            await asyncio.Event().wait()
        if fault.kind == "reset":
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                            request=request)
        if fault.kind == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if fault.kind == "status":
            error = {"error": {"message": f"{self.name} fails on cue", "type": "fake",
                               "code": fault.status_code}}
            return httpx.Response(fault.status_code, content=json.dumps(error).encode(),
                                  headers={"content-type": "application/json"})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": fake_chat_ids(body["messages"])})
        if fault.kind == "garbage":
            return httpx.Response(200, content=b"<html>502 Bad Gateway</html>",
                                  headers={"content-type": "application/json"})
        chat = request.url.path.endswith("/chat/completions")
        words = f"Hello from {self.name}, a fake node.".split(" ")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        words = words[:limit] if limit else words
        if fault.kind == "endless":
            words = words + ["more"] * 1000
        envelope = Envelope.new(self.name, MODEL, chat)
        if body.get("stream"):
            chunks = _sse(envelope, words)
        else:
            whole = json.dumps(self._whole(request, body, envelope, words)).encode()
            chunks = [whole[:len(whole) // 2], whole[len(whole) // 2:]]
        if fault.kind == "die_after":
            chunks = chunks[:fault.chunks]
        content_type = "text/event-stream" if body.get("stream") else "application/json"
        return httpx.Response(200, headers={"content-type": content_type},
                              stream=_Body(self, request, chunks, fault.kind == "die_after"))

    def _whole(self, request: httpx.Request, body: dict[str, Any], envelope: Envelope,
               words: list[str]) -> dict[str, Any]:
        kv_params = None
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            # Each prefill's params name its request, so a test can tell whose params D got.
            kv_params = self.kv_params and {
                **self.kv_params, "remote_request_id": request.headers["x-request-id"]}
        given = body.get("kv_transfer_params") or {}
        prompt_ids = fake_chat_ids(body["messages"]) if "messages" in body else []
        reply_ids = self.reply_ids if self.reply_ids is not None else fake_ids(" ".join(words))
        if self.keeps_readback and "kv_transfer_params" in body and not given.get(
                "do_remote_decode"):  # a D leg, or a local leg asking D to keep its blocks
            kv_params = {"do_remote_prefill": False, "do_remote_decode": True,
                         "remote_engine_id": f"engine-{self.name}",
                         "remote_request_id": request.headers["x-request-id"],
                         "remote_block_ids": [7, 8, 9], "remote_host": "10.0.0.2",
                         "remote_port": 5601,
                         "remote_num_tokens": len(prompt_ids) + len(reply_ids) - 1,
                         "remote_blocks_expiry_time": 1e9}
        answer = envelope.complete(" ".join(words), "stop", usage(10, len(words), None),
                                   kv_params)
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = prompt_ids
            answer["choices"][0]["token_ids"] = reply_ids
        return answer



class _Body(httpx.AsyncByteStream):
    """A response body sent chunk by chunk; closing it before its end counts as cancelled."""

    def __init__(self, node: MockNode, request: httpx.Request, chunks: list[bytes],
                 die: bool) -> None:
        self._node = node
        self._request = request
        self._chunks = chunks
        self._die = die
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._node.open += 1
        try:
            for chunk in self._chunks:
                yield chunk
                await asyncio.sleep(0)
            if self._die:
                self._done = True
                raise httpx.ReadError(f"{self._node.name} dies mid-body on cue",
                                      request=self._request)
            self._node.finished += 1
            self._done = True
        finally:
            self._node.open -= 1

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._node.cancelled += 1


def _sse(envelope: Envelope, words: list[str]) -> list[bytes]:
    events = [envelope.chunk(word if i == 0 else " " + word) for i, word in enumerate(words)]
    return [*events, envelope.chunk(None, "stop"), DONE]


class MockCluster:
    """Named fake nodes and the transport that reaches them by host name."""

    def __init__(self, *names: str) -> None:
        self.nodes = {name: MockNode(name) for name in names}
        self.transport = httpx.MockTransport(self._handle)

    def __getitem__(self, name: str) -> MockNode:
        return self.nodes[name]

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        node = self.nodes.get(request.url.host)
        if node is None:
            raise httpx.ConnectError(f"no node at {request.url.host}", request=request)
        return await node.handle(request)

    def request_ids(self) -> Counter[tuple[str, str]]:
        """How often each node received each X-Request-Id."""
        return Counter((node.name, r.headers["x-request-id"])
                       for node in self.nodes.values() for r in node.received)
