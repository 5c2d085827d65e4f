"""Every `proxy.upstream.legs.Legs` over real sockets: the same request out, the same answer in, and
each failure moment the same proxy error, whichever implementation sends the leg.

Each failure is provoked by a raw TCP server doing the wrong thing at one moment, and must
come out as the error `proxy.routing.failover` reads by what it means for a retry: refused (never
sent), timed out, or broken (the node may have run the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.shared.errors import ProxyError, UpstreamBroken, UpstreamRefused, UpstreamTimeout
from proxy.upstream.aiohttp_legs import AiohttpLegs
from proxy.upstream.http1 import Http1Pool
from proxy.upstream.httpx_legs import HttpxLegs, httpx_pool
from proxy.upstream.legs import LegResponse, Legs, LegsFactory, LegTimeouts
from proxy.upstream.transport import DefaultLegs
from tests.proxy.raw_http import read_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUT = LegTimeouts(connect=5.0, read=0.5)
HEADERS = {"authorization": "Bearer k"}

IMPLEMENTATIONS: dict[str, LegsFactory] = {
    "http1": Http1Pool,
    "aiohttp": AiohttpLegs,
    "httpx": lambda timeout, headers: HttpxLegs(httpx_pool(), timeout, headers),
    "default": DefaultLegs,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def open_legs(request: pytest.FixtureRequest) -> LegsFactory:
    return IMPLEMENTATIONS[request.param]


@contextlib.asynccontextmanager
async def tcp_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def body_of(response: LegResponse) -> bytes:
    """The body chunk by chunk, as the relay reads it."""
    parts = []
    while chunk := await response.read_chunk():
        parts.append(chunk)
    return b"".join(parts)


async def post(open_legs: LegsFactory, url: str) -> tuple[int, str, bytes]:
    legs: Legs = open_legs(TIMEOUT, HEADERS)
    try:
        response = await legs.post(url + "/v1/completions", b"{}",
                                   {"content-type": "application/json", "x-request-id": "r-1"})
        try:
            body = await body_of(response)
        finally:
            await response.aclose()
        return response.status, response.content_type, body
    finally:
        await legs.aclose()


async def test_request_and_answer_pass_through_unchanged(open_legs: LegsFactory) -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        body = '{"error": "ça"}'.encode()
        writer.write(b"HTTP/1.1 422 Unprocessable\r\ncontent-type: application/json\r\n"
                     b"x-node: d1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
                     + body)
        await writer.drain()
        writer.close()

    legs = open_legs(TIMEOUT, HEADERS)
    async with tcp_server(answer) as url:
        response = await legs.post(url + "/v1/completions", '{"prompt":"é"}'.encode(),
                                   {"content-type": "application/json", "x-request-id": "r-1"})
        body = await response.aread()
        await response.aclose()
    await legs.aclose()
    assert (response.status, response.content_type) == (422, "application/json")
    assert body == '{"error": "ça"}'.encode()
    head, _, sent = seen[0].partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    assert lines[0] == b"post /v1/completions http/1.1"
    assert {b"x-request-id: r-1", b"authorization: bearer k",
            b"content-type: application/json"} <= set(lines)
    assert sent == '{"prompt":"é"}'.encode()


async def test_a_streamed_answer_passes_status_type_and_body(open_legs: LegsFactory) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\nd\r\ndata: first\n\n\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with tcp_server(answer) as url:
        assert await post(open_legs, url) == (200, "text/event-stream", b"data: first\n\n")


@pytest.mark.parametrize(("behaviour", "error"), [
    ("hang_up", UpstreamBroken),   # closed before the answer: the node may have run it
    ("silent", UpstreamTimeout),
    ("cut", UpstreamBroken),       # closed inside the body
])
async def test_each_failure_moment_is_the_same_proxy_error(
        behaviour: str, error: type[ProxyError], open_legs: LegsFactory) -> None:
    async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if behaviour == "silent":
            await asyncio.sleep(3)
        elif behaviour == "cut":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"d\r\ndata: first\n\n\r\n")
            await writer.drain()
        writer.close()

    async with tcp_server(node) as url:
        with pytest.raises(error, match=f"backend {url}/v1/completions") as raised:
            await post(open_legs, url)
    assert type(raised.value) is error


async def test_a_closed_port_is_refused(open_legs: LegsFactory) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket closes
    with pytest.raises(UpstreamRefused, match=f"cannot connect to backend http://127.0.0.1:"
                                              f"{port}/v1/completions") as raised:
        await post(open_legs, f"http://127.0.0.1:{port}")
    assert raised.value.kind == "connect"


async def test_closing_a_stream_early_closes_its_connection(open_legs: LegsFactory) -> None:
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"d\r\ndata: first\n\n\r\n")
        await writer.drain()
        if await reader.read(1) == b"":  # the client hung up
            closed.set()

    legs = open_legs(TIMEOUT, HEADERS)
    async with tcp_server(endless) as url:
        response = await legs.post(url + "/v1/completions", b"{}", {})
        assert await response.read_chunk() == b"data: first\n\n"
        await response.aclose()
        await asyncio.wait_for(closed.wait(), 5)
    await legs.aclose()
