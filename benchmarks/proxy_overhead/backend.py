"""A zero-compute fake vLLM in its own process: answers as fast as aiohttp can write.

    python -m benchmarks.proxy_overhead.backend --port 9001 --port 9002 --tokens 16

Every port serves the same app (one P and one D node are two ports of one process). A P leg
(`kv_transfer_params.do_remote_decode`) gets vLLM's `max_tokens: 1` JSON answer with
`kv_transfer_params`; any other completion request gets N streamed chat tokens as vLLM writes
them (one SSE event per chunk, a usage event when asked, `[DONE]`), encoded by the
emulator's encoder (`profiler.emulate.openai_format.Envelope`). The events are encoded
once at start-up, so the process spends its time on HTTP only. It prints `ready` when it
listens, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import uvloop
from aiohttp import web

from profiler.emulate.openai_format import DONE, Envelope
from profiler.emulate.openai_format import usage as usage_block

MODEL = "bench-model"
_P_MARKERS = (b'"do_remote_decode":true', b'"do_remote_decode": true')


def is_prefill_leg(body: bytes) -> bool:
    """Whether a request body is a P leg (the proxy asked for a remote decode)."""
    return any(marker in body for marker in _P_MARKERS)


def stream_events(tokens: int, usage: bool) -> list[bytes]:
    """The SSE events of one streamed chat reply of `tokens` tokens, as vLLM writes them."""
    envelope = Envelope("chatcmpl-bench", MODEL, True, 1)
    events = [envelope.chunk(None, role=True)]
    events += [envelope.chunk(f" tok{i}") for i in range(tokens)]
    events.append(envelope.chunk(None, "length"))
    if usage:
        events.append(envelope.usage_chunk(usage_block(100, tokens, None)))
    events.append(DONE)
    return events


def prefill_answer() -> bytes:
    """vLLM's answer to a P leg: one token and the kv_transfer_params D needs."""
    kv_params = {"do_remote_prefill": True, "do_remote_decode": False,
                 "remote_engine_id": "bench-p", "remote_block_ids": [1, 2, 3],
                 "remote_host": "127.0.0.1", "remote_port": 5600}
    envelope = Envelope("chatcmpl-bench-p", MODEL, True, 1)
    return json.dumps(envelope.complete(" tok0", "length", usage_block(100, 1, None),
                                        kv_params)).encode()


def build_app(tokens: int) -> web.Application:
    """The fake node: /health, /v1/models, /v1/chat/completions, /v1/completions."""
    plain, with_usage = stream_events(tokens, False), stream_events(tokens, True)
    prefilled = prefill_answer()
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def list_models(_: web.Request) -> web.Response:
        return web.Response(text=models, content_type="application/json")

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if is_prefill_leg(body):
            return web.Response(body=prefilled, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in with_usage if b'"include_usage"' in body else plain:
            await response.write(event)
            await asyncio.sleep(0)  # one engine step per token: other streams interleave
        await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    return app


async def serve(ports: list[int], tokens: int) -> None:
    """Listen on every port until SIGTERM/SIGINT."""
    runner = web.AppRunner(build_app(tokens), access_log=None, handle_signals=False)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, action="append", required=True)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.port, args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
