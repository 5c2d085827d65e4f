"""A fake OpenAI-compatible streaming server with controlled delays, for replay tests.

A raw ASGI app (no framework) that answers /v1/models, /v1/chat/completions and
/v1/completions like a PPD proxy in front of vLLM: it streams `max_tokens` tokens (as with
ignore_eos), the first after `ttft_s`, the next ones every `itl_s`, then a usage chunk and
[DONE]; it sets the proxy's x-ppd-* headers and records every request body and header set.
`serve()` runs it with hypercorn on 127.0.0.1 on an OS-chosen port; `serve_in_thread()` does
the same on a background thread for synchronous callers (CLI tests). Events are encoded by
the emulator's encoder (`profiler.emulate.openai_format.Envelope`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from profiler.emulate.openai_format import DONE, Envelope, usage

MODEL = "fake-model"


@dataclass
class FakeTimedServer:
    """The fake's knobs (set per test) and what it saw (read by the test)."""

    ttft_s: float = 0.05
    itl_s: float = 0.01
    status: int = 200
    route: str = "pd"  # x-ppd-route unless the request forces one
    decode: str = "http://127.0.0.1:9001"
    prefill: str = "http://127.0.0.1:9101"
    stall_after_tokens: int | None = None  # stop sending (never finish) after this many
    include_usage: bool = True
    ttft_for_turn: Callable[[int], float] | None = None  # per-turn TTFT override
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = (await receive())["type"]
                if event == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif event == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            await _json(send, 404, {"error": {"message": "not found", "type": "not_found"}})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = json.loads(raw)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.bodies.append(body)
        self.headers.append(headers)
        if self.status != 200:
            await _json(send, self.status, {"error": {"message": "injected failure",
                                                      "type": "server_error"}})
            return
        chat = path.endswith("chat/completions")
        if body.get("stream") is False:
            await self._whole(send, body, chat)
            return
        await self._stream(send, body, headers, chat=chat)

    async def _whole(self, send: Callable, body: dict, chat: bool) -> None:
        """A non-streamed answer: the whole reply after TTFT + (n - 1) inter-token gaps."""
        turn = self._turn(body, chat)
        index = len(self.bodies)
        n_tokens = int(body.get("max_tokens", 16))
        ttft = self.ttft_for_turn(turn) if self.ttft_for_turn else self.ttft_s
        await asyncio.sleep(ttft + self.itl_s * (n_tokens - 1))
        text = "".join(f" r{index}w{i}" for i in range(n_tokens))
        self.replies.append(text)
        envelope = Envelope.new(f"timed-{index}", str(body.get("model", MODEL)), chat)
        await _json(send, 200, envelope.complete(text, "length", usage(7 * turn, n_tokens, None),
                                                 None))

    def _turn(self, body: dict[str, Any], chat: bool) -> int:
        if chat:
            return sum(1 for m in body["messages"] if m.get("role") == "user")
        return str(body["prompt"]).count("User: ")

    async def _stream(self, send: Callable, body: dict, headers: dict[str, str],
                      chat: bool) -> None:
        turn = self._turn(body, chat)
        route = headers.get("x-ppd-route", self.route)
        response_headers = [
            (b"content-type", b"text/event-stream"),
            (b"x-ppd-route", route.encode()),
            (b"x-ppd-turn", str(turn).encode()),
            (b"x-ppd-decode", self.decode.encode()),
        ]
        if route == "pd":
            response_headers.append((b"x-ppd-prefill", self.prefill.encode()))
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        index = len(self.bodies)
        n_tokens = int(body.get("max_tokens", 16))
        envelope = Envelope.new(f"timed-{index}", str(body.get("model", MODEL)), chat)
        if chat:  # vLLM opens a chat stream with an empty role-only delta
            await _event(send, envelope.chunk(None, role=True))
        ttft = self.ttft_for_turn(turn) if self.ttft_for_turn else self.ttft_s
        await asyncio.sleep(ttft)
        words = [f" r{index}w{i}" for i in range(n_tokens)]
        for i, word in enumerate(words):
            if self.stall_after_tokens is not None and i >= self.stall_after_tokens:
                await asyncio.sleep(3600)  # cancelled when the client gives up
            if i:
                await asyncio.sleep(self.itl_s)
            await _event(send, envelope.chunk(word))
        self.replies.append("".join(words))
        if self.include_usage and body.get("stream_options", {}).get("include_usage"):
            await _event(send, envelope.usage_chunk(usage(7 * turn, n_tokens, None)))
        await send({"type": "http.response.body", "body": DONE, "more_body": False})


async def _event(send: Callable, event: bytes) -> None:
    await send({"type": "http.response.body", "body": event, "more_body": True})


async def _json(send: Callable, status: int, payload: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


@asynccontextmanager
async def serve(app: FakeTimedServer) -> AsyncIterator[str]:
    """Serve app on 127.0.0.1 (OS-chosen port) with hypercorn; yields the base URL."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5
    stop = asyncio.Event()
    task = asyncio.create_task(hypercorn_serve(app, config, shutdown_trigger=stop.wait))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        with contextlib.suppress(OSError):  # hypercorn may already have closed the fd
            sock.close()


@contextlib.contextmanager
def serve_in_thread(app: FakeTimedServer) -> Iterator[str]:
    """`serve` on its own event loop in a thread, for code that runs asyncio.run itself."""
    ready: queue.Queue[str] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def run() -> None:
        async with serve(app) as url:
            ready.put(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    try:
        yield ready.get(timeout=10)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        loop.close()
