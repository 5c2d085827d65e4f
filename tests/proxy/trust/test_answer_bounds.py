"""Issue #45, failures 9 and 10: a node's whole answer and each of its stream events are
bounded in bytes (502 naming the flag), and other clients keep being served."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from proxy.shared.limits import Limits
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.behaviour.test_errors import assert_openai_error
from tests.proxy.helpers import chat_body, config_for, serve_proxy


async def test_a_whole_answer_over_the_limit_is_a_502_naming_it() -> None:
    async with FakeVLLM("big", reply="word " * 200_000) as big, FakeVLLM("p0") as p0, \
            FakeVLLM("d0") as small:
        config = config_for({"p0": p0, "d0": big}, limits=Limits(max_answer_bytes=100_000))
        async with serve_proxy(config) as proxy:
            refused = await proxy.client.post("/v1/chat/completions",
                                              json=chat_body("x", max_tokens=300_000))
            streamed = await proxy.client.post("/v1/chat/completions",
                                               json=chat_body("x", stream=True))
        assert "--max-answer-bytes" in assert_openai_error(refused, 502)["message"]
        assert streamed.status_code == 200  # many small events: no limit reached
        config = config_for({"p0": p0, "d0": small}, limits=Limits(max_answer_bytes=100_000))
        async with serve_proxy(config) as proxy:
            served = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        assert served.status_code == 200


@contextlib.asynccontextmanager
async def endless_event_node() -> AsyncIterator[str]:
    """A node whose stream sends one `data:` line that never ends (no blank line)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            if b"/health" in head.split(b"\r\n")[0]:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            piece = b"data: " + b"x" * 65_536
            for _ in range(10_000):  # 650 MB if nobody stops it
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                piece = b"x" * 65_536
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_stream_event_that_never_ends_is_cut_at_the_limit(stream: bool) -> None:
    async with endless_event_node() as url:
        fake = FakeVLLM("d0")
        fake.url = url
        async with FakeVLLM("p0") as p0:
            config = replace(config_for({"p0": p0, "d0": fake}),
                             limits=Limits(max_stream_event_bytes=1024 * 1024,
                                           max_answer_bytes=2 * 1024 * 1024))
            async with serve_proxy(config) as proxy:
                response = await proxy.client.post("/v1/chat/completions",
                                                   json=chat_body("x", stream=stream))
        if stream:
            # The first chunk already passed to the client: the error comes in band, or the
            # 502 before it; either way the client is told and the stream ends.
            assert response.status_code in (200, 502)
            assert "--max-stream-event-bytes" in response.text
        else:
            assert "--max-answer-bytes" in assert_openai_error(response, 502)["message"]
