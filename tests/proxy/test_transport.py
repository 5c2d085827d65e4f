"""`proxy.transport.AiohttpTransport`: httpx requests over aiohttp, failures as httpx errors.

Each failure is provoked by a raw TCP server doing the wrong thing at one moment, and must
come out as the httpx error `proxy.forward` classifies by what it means for a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from proxy.transport import AiohttpTransport, LegTransport
from tests.proxy.raw_http import read_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def tcp_server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()




@contextlib.asynccontextmanager
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=AiohttpTransport(),
                                 timeout=httpx.Timeout(5.0, read=0.5)) as c:
        yield c


async def test_request_and_answer_pass_through_unchanged() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        body = '{"error": "ça"}'.encode()
        writer.write(b"HTTP/1.1 422 Unprocessable\r\ncontent-type: application/json\r\n"
                     b"x-node: d1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
                     + body)
        await writer.drain()
        writer.close()

    async with tcp_server(answer) as url, client() as c:
        response = await c.post(url + "/v1/completions", json={"prompt": "é"},
                                headers={"X-Request-Id": "r-1"})
    assert response.status_code == 422
    assert response.headers["x-node"] == "d1"
    assert response.json() == {"error": "ça"}
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert b"POST /v1/completions HTTP/1.1" in head and b"x-request-id: r-1" in head.lower()
    assert body == '{"prompt":"é"}'.encode()


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket closes
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.post(f"http://127.0.0.1:{port}/v1/completions", json={})


async def test_a_server_closing_before_answering_is_a_protocol_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async with tcp_server(hang_up) as url, client() as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(url + "/v1/completions", json={})


async def test_a_silent_server_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(3)
        writer.close()

    async with tcp_server(silent) as url, client() as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(url + "/v1/completions", json={})


async def test_a_body_cut_mid_stream_is_a_read_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"d\r\ndata: first\n\n\r\n")
        await writer.drain()
        writer.close()

    chunks = []
    async with tcp_server(cut) as url, client() as c, \
            c.stream("POST", url + "/v1/completions", json={}) as response:
        with pytest.raises(httpx.ReadError):
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
    assert b"".join(chunks) == b"data: first\n\n"


async def test_closing_a_stream_early_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"d\r\ndata: first\n\n\r\n")
        await writer.drain()
        if await reader.read(1) == b"":  # the client hung up
            closed.set()

    async with tcp_server(endless) as url, client() as c:
        async with c.stream("POST", url + "/v1/completions", json={}) as response:
            async for _ in response.aiter_raw():
                break
        await asyncio.wait_for(closed.wait(), 5)


# The legs' own path (`post`, used by proxy.forward without httpx's Request and Response
# objects) fails the same way, moment by moment: through aiohttp (AiohttpTransport) and
# through proxy.http1 (LegTransport, the default).
TIMEOUT = httpx.Timeout(5.0, read=0.5)


@pytest.fixture(params=[AiohttpTransport, LegTransport])
def leg_transport(request: pytest.FixtureRequest) -> type[AiohttpTransport]:
    return request.param  # type: ignore[no-any-return]


async def _post(url: str, kind: type[AiohttpTransport] = LegTransport
                ) -> tuple[int, str, bytes]:
    transport = kind()
    try:
        response = await transport.post(url + "/v1/completions", b"{}",
                                        {"content-type": "application/json"}, TIMEOUT)
        try:
            body = b"".join([chunk async for chunk in response.aiter()])
        finally:
            await response.aclose()
        return response.status, response.content_type, body
    finally:
        await transport.aclose()


async def test_post_passes_status_type_and_body_through(
        leg_transport: type[AiohttpTransport]) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\nd\r\ndata: first\n\n\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with tcp_server(answer) as url:
        assert await _post(url, leg_transport) == (200, "text/event-stream",
                                                   b"data: first\n\n")


@pytest.mark.parametrize(("behaviour", "error"), [
    ("hang_up", httpx.RemoteProtocolError),
    ("silent", httpx.ReadTimeout),
    ("cut", httpx.ReadError),
])
async def test_post_failures_are_the_same_httpx_errors(
        behaviour: str, error: type[httpx.TransportError],
        leg_transport: type[AiohttpTransport]) -> None:
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
        with pytest.raises(error):
            await _post(url, leg_transport)


async def test_post_to_a_closed_port_is_a_connect_error(
        leg_transport: type[AiohttpTransport]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await _post(f"http://127.0.0.1:{port}", leg_transport)
