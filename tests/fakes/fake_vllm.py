"""A fake vLLM OpenAI server for tests: records what it receives, answers like vLLM, fails on cue.

    async with FakeVLLM("d1") as d1:
        ... d1.url, d1.requests[-1].body, d1.fail_with(503), d1.faults.hang = True ...

Answers /v1/chat/completions and /v1/completions (streamed as SSE, or one JSON), /v1/models
and /health. A P-leg request (kv_transfer_params.do_remote_decode) gets kv_transfer_params
back, like vLLM's NixlConnector producer. Answers are encoded by the emulator's encoder
(`profiler.emulate.openai_format.Envelope`); the fault hooks wrap it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from quart import Quart, Response, request

from profiler.emulate.openai_format import DONE, Envelope, usage
from proxy.serving.server import running


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
        # POST /reset_prefix_cache (vLLM's dev-mode route): False answers 404 as vLLM without
        # VLLM_SERVER_DEV_MODE=1; `reset_refusals` answers {"success": false} that many times.
        self.dev_mode = True
        self.reset_refusals = 0
        self.prefix_cache_resets = 0
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

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> tuple[dict[str, Any], int]:
            if not self.dev_mode:
                return {"detail": "Not Found"}, 404
            if self.reset_refusals > 0:
                self.reset_refusals -= 1
                return {"success": False}, 200
            self.prefix_cache_resets += 1
            return {"success": True}, 200

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
        thoughts = (self.reasoning or "").split()
        if max_tokens:
            # Like vLLM: max_tokens bounds everything generated, the thinking included.
            thoughts = thoughts[:max_tokens]
            words = words[:max(0, max_tokens - len(thoughts))]
        prompt_tokens = len(json.dumps(body.get("messages", body.get("prompt")))) // 4
        generated = len(words) + len(thoughts)  # vLLM counts both
        usage_block = usage(prompt_tokens, generated, None)
        envelope = Envelope.new(f"{self.name}-{len(self.requests)}", self.model, chat)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Response(self._sse(envelope, thoughts, words,
                                      usage_block if include_usage else None),
                            content_type="text/event-stream")
        finish = "length" if max_tokens == len(words) + len(thoughts) else "stop"
        answer = envelope.complete(" ".join(words), finish, usage_block,
                                   self.kv_params if is_prefill else None,
                                   " ".join(thoughts) if self.reasoning is not None else None,
                                   self.reasoning_field)
        return Response(json.dumps(answer), content_type="application/json")

    async def _sse(self, envelope: Envelope, thoughts: list[str], words: list[str],
                   usage_block: dict[str, Any] | None) -> AsyncIterator[bytes]:
        self.streams_started += 1
        try:
            events: list[bytes] = []
            if envelope.chat:
                events.append(envelope.chunk(None, role=True))
                events.extend(envelope.reasoning_chunk(thought + " ", self.reasoning_field)
                              for thought in thoughts)
            events.extend(envelope.chunk(word if i == 0 else " " + word)
                          for i, word in enumerate(words))
            events.append(envelope.chunk(None, "stop"))
            for n, event in enumerate(events):
                if self.faults.die_after_chunks is not None and n >= self.faults.die_after_chunks:
                    raise ConnectionAbortedError(f"{self.name} dies mid-stream on cue")
                yield event
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            if usage_block is not None:
                yield envelope.usage_chunk(usage_block)
            yield DONE
            if self.faults.linger_after_done_s:
                await asyncio.sleep(self.faults.linger_after_done_s)
            self.streams_finished += 1
        except (asyncio.CancelledError, GeneratorExit):
            self.streams_cancelled += 1
            raise
