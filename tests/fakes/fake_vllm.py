"""A fake vLLM OpenAI server for tests: records what it receives, answers like vLLM, fails on cue.

    async with FakeVLLM("d1") as d1:
        ... d1.url, d1.requests[-1].body, d1.fail_with(503), d1.faults.hang = True ...

Answers /v1/chat/completions and /v1/completions (streamed as SSE, or one JSON), /v1/models
and /health. A P-leg request (kv_transfer_params.do_remote_decode) gets kv_transfer_params
back, like vLLM's NixlConnector producer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from quart import Quart, Response, request

from proxy.server import running


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the fake received it."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(slots=True)
class Faults:
    """What the fake does wrong, on cue."""

    statuses: list[int] = field(default_factory=list)  # answer these statuses first, in order
    hang: bool = False  # never answer
    delay_s: float = 0.0  # wait before answering
    die_after_chunks: int | None = None  # break the connection mid-stream
    linger_after_done_s: float = 0.0  # keep the stream open after `[DONE]` (slow close)


class FakeVLLM:
    """One fake node; its reply text names it, so tests can tell which node answered."""

    def __init__(self, name: str = "fake", model: str = "fake-model",
                 reply: str | None = None, chunk_delay_s: float = 0.0,
                 kv_params: dict[str, Any] | None = None, reasoning: str | None = None,
                 reasoning_field: str = "reasoning_content") -> None:
        self.name = name
        # Like vLLM with a reasoning parser: the thinking streams first, in its own field.
        self.reasoning = reasoning
        self.reasoning_field = reasoning_field
        self.model = model
        self.reply = reply if reply is not None else f"Hello from {name}, a fake node."
        self.chunk_delay_s = chunk_delay_s
        self.kv_params = kv_params if kv_params is not None else {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": f"engine-{name}", "remote_block_ids": [1, 2, 3],
            "remote_host": "127.0.0.1", "remote_port": 5600,
        }
        self.requests: list[Recorded] = []
        self.faults = Faults()
        self.health_status = 200
        self.metrics_text: str | None = None  # what /metrics serves (None: 404, no metrics)
        self.streams_started = 0
        self.streams_cancelled = 0
        self.streams_finished = 0
        self.requests_cancelled = 0
        self.url = ""
        self.app = self._build_app()
        self._running: Any = None

    @property
    def completions(self) -> list[Recorded]:
        """Completion requests only (not /health or /v1/models)."""
        return [r for r in self.requests if r.path.endswith("completions")]

    def fail_with(self, *statuses: int) -> None:
        """Answer the next requests with these statuses."""
        self.faults.statuses.extend(statuses)

    async def __aenter__(self) -> FakeVLLM:
        self._running = running(self.app)
        server = await self._running.__aenter__()
        self.url = server.url
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._running.__aexit__(exc_type, exc, tb)

    def _build_app(self) -> Quart:
        app = Quart(f"fake-vllm-{self.name}")
        app.config["RESPONSE_TIMEOUT"] = None

        @app.get("/health")
        async def health() -> tuple[str, int]:
            return "", self.health_status

        @app.get("/metrics")
        async def metrics() -> tuple[str, int]:
            return (self.metrics_text, 200) if self.metrics_text is not None else ("", 404)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

        @app.post("/v1/chat/completions")
        async def chat() -> Response:
            return await self._complete(chat=True)

        @app.post("/v1/completions")
        async def completions() -> Response:
            return await self._complete(chat=False)

        return app

    async def _complete(self, chat: bool) -> Response:
        body = await request.get_json()
        self.requests.append(Recorded(request.path, body,
                                      {k.lower(): v for k, v in request.headers.items()}))
        try:
            if self.faults.hang:
                await asyncio.sleep(3600)
            if self.faults.delay_s:
                await asyncio.sleep(self.faults.delay_s)
        except asyncio.CancelledError:
            self.requests_cancelled += 1  # the caller hung up before the answer
            raise
        if self.faults.statuses:
            status = self.faults.statuses.pop(0)
            error = {"error": {"message": f"{self.name} fails on cue", "type": "fake",
                               "code": status}}
            return Response(json.dumps(error), status=status, content_type="application/json")
        is_prefill = bool((body.get("kv_transfer_params") or {}).get("do_remote_decode"))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        words = self.reply.split(" ")
        if max_tokens:
            words = words[:max_tokens]
        prompt_tokens = len(json.dumps(body.get("messages", body.get("prompt")))) // 4
        generated = len(words) + len((self.reasoning or "").split())  # vLLM counts both
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                 "total_tokens": prompt_tokens + generated}
        text = " ".join(words)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Response(self._sse(chat, words, usage if include_usage else None),
                            content_type="text/event-stream")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if max_tokens ==
                                  len(words) else "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            if self.reasoning is not None:
                choice["message"][self.reasoning_field] = self.reasoning
        else:
            choice["text"] = text
        answer: dict[str, Any] = {
            "id": f"cmpl-{self.name}-{len(self.requests)}", "created": int(time.time()),
            "object": "chat.completion" if chat else "text_completion", "model": self.model,
            "choices": [choice], "usage": usage,
        }
        if is_prefill:
            answer["kv_transfer_params"] = self.kv_params
        return Response(json.dumps(answer), content_type="application/json")

    async def _sse(self, chat: bool, words: list[str],
                   usage: dict[str, Any] | None) -> AsyncIterator[bytes]:
        self.streams_started += 1
        base = {"id": f"cmpl-{self.name}", "created": int(time.time()), "model": self.model,
                "object": "chat.completion.chunk" if chat else "text_completion"}
        try:
            pieces: list[dict[str, Any]] = []
            if chat:
                pieces.append({"index": 0, "delta": {"role": "assistant", "content": ""},
                               "finish_reason": None})
                pieces.extend({"index": 0, "delta": {self.reasoning_field: thought + " "},
                               "finish_reason": None}
                              for thought in (self.reasoning or "").split())
            for i, word in enumerate(words):
                text = word if i == 0 else " " + word
                pieces.append({"index": 0, "delta": {"content": text}, "finish_reason": None}
                              if chat else {"index": 0, "text": text, "finish_reason": None})
            pieces.append({"index": 0, "delta": {}, "finish_reason": "stop"} if chat
                          else {"index": 0, "text": "", "finish_reason": "stop"})
            for n, choice in enumerate(pieces):
                if self.faults.die_after_chunks is not None and n >= self.faults.die_after_chunks:
                    raise ConnectionAbortedError(f"{self.name} dies mid-stream on cue")
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            if usage is not None:
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            if self.faults.linger_after_done_s:
                await asyncio.sleep(self.faults.linger_after_done_s)
            self.streams_finished += 1
        except (asyncio.CancelledError, GeneratorExit):
            self.streams_cancelled += 1
            raise
