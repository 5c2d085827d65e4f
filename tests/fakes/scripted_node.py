"""A vLLM node on a raw asyncio socket whose completions a test scripts byte by byte.

For answers no well-behaved server framework would send: 200 MB in one body, a stream event
that never ends, `1` followed by 308 zeros where a count belongs, NaN. /health answers 200,
/v1/models names the model, /metrics serves `metrics_text` (404 without), and every
completion request is answered by `script(path, body)`: a head (status, content type, a
length or None for chunked) and the body's pieces, written as they are produced, so the
fake itself never holds a 200 MB answer.

    async with scripted_node(lambda path, body: Answer.whole(b'{"choices": []}')) as node:
        ... node.url, node.received ...

`served_mock` puts a `tests.fakes.mock_vllm.MockNode` (readback, /tokenize, scripted faults)
on such a socket, for a proxy in another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from tests.fakes.mock_vllm import MockNode

MODEL = "fake-model"


@dataclass(frozen=True)
class Answer:
    """What a scripted node sends for one completion request."""

    pieces: Iterable[bytes]
    content_type: str = "application/json"
    length: int | None = None  # None: chunked transfer encoding
    status: int = 200
    pause_s: float = 0.0  # a wait after the first piece (the rest, and the end, go out at once)

    @staticmethod
    def whole(body: bytes, status: int = 200) -> Answer:
        return Answer((body,), length=len(body), status=status)

    @staticmethod
    def sse(text: str) -> Answer:
        return Answer((text.encode(),), "text/event-stream")


Script = Callable[[str, dict[str, Any]], Answer]


@dataclass
class ScriptedNode:
    """The running node: its URL and the completion bodies it received."""

    url: str
    received: list[dict[str, Any]]
    metrics_text: str | None = None


Respond = Callable[[str, dict[str, str], bytes], Awaitable[Answer]]


@contextlib.asynccontextmanager
async def http_node(respond: Respond) -> AsyncIterator[str]:
    """Serve respond(path, headers, body) on a loopback port for the block; yield its URL."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # CancelledError too: the test's loop ending cancels connections still open, and a
        # cancelled handler would be logged as an error by asyncio's stream callback.
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError,
                                 asyncio.LimitOverrunError, ValueError, asyncio.CancelledError):
            while True:  # keep-alive: the proxy pools its connections
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                path = request_line.split(" ")[1].split("?")[0]
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines if line)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                await _write(writer, await respond(path, headers, raw))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@contextlib.asynccontextmanager
async def scripted_node(script: Script, metrics_text: str | None = None
                        ) -> AsyncIterator[ScriptedNode]:
    """Serve a scripted node on a loopback port for the block."""
    node = ScriptedNode("", [], metrics_text)

    async def respond(path: str, headers: dict[str, str], raw: bytes) -> Answer:
        if path == "/health":
            return Answer.whole(b"")
        if path == "/v1/models":
            return Answer.whole(json.dumps({"object": "list", "data": [
                {"id": MODEL, "object": "model"}]}).encode())
        if path == "/metrics":
            return (Answer.whole(node.metrics_text.encode()) if node.metrics_text is not None
                    else Answer.whole(b"", 404))
        body = json.loads(raw) if raw else {}
        node.received.append(body)
        return script(path, body)

    async with http_node(respond) as url:
        node.url = url
        yield node


@contextlib.asynccontextmanager
async def served_mock(node: MockNode, rewrite: Callable[[bytes], bytes] = lambda b: b
                      ) -> AsyncIterator[str]:
    """A `tests.fakes.mock_vllm.MockNode` on a real socket (its readback, /tokenize and
    faults), every answer's body passed through rewrite; yields its URL."""
    async def respond(path: str, headers: dict[str, str], raw: bytes) -> Answer:
        request = httpx.Request("POST" if raw else "GET", f"{node.url}{path}",
                                headers=headers, content=raw)
        try:
            response = await node.handle(request)
        except httpx.TransportError:
            return Answer.whole(b"", 503)  # a refused or reset connection, near enough
        body = rewrite(await response.aread())
        return replace(Answer.whole(body, response.status_code),
                       content_type=response.headers.get("content-type", "application/json"))

    async with http_node(respond) as url:
        yield url


async def _write(writer: asyncio.StreamWriter, answer: Answer) -> None:
    framing = (f"content-length: {answer.length}" if answer.length is not None
               else "transfer-encoding: chunked")
    writer.write(f"HTTP/1.1 {answer.status} X\r\ncontent-type: {answer.content_type}\r\n"
                 f"{framing}\r\n\r\n".encode())
    for n, piece in enumerate(answer.pieces):
        writer.write(piece if answer.length is not None else b"%x\r\n%s\r\n" % (len(piece),
                                                                                  piece))
        await writer.drain()
        if n == 0 and answer.pause_s:
            await asyncio.sleep(answer.pause_s)
    if answer.length is None:
        writer.write(b"0\r\n\r\n")
    await writer.drain()
