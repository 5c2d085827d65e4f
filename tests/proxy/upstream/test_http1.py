"""`proxy.upstream.http1`: the legs' HTTP/1.1 client, against raw TCP servers doing one thing each.

The failure moments shared with the other legs are in test_legs.py; these are the pool's
own promises: exact request bytes, connection reuse and its limits, framing, flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.shared.errors import UpstreamBroken, UpstreamTimeout
from proxy.upstream.http1 import Http1Pool, Http1Response
from proxy.upstream.legs import LegTimeouts
from tests.proxy.raw_http import read_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUT = LegTimeouts(connect=5.0, read=0.5)
EVENT = b"data: x\n\n"


@contextlib.asynccontextmanager
async def tcp_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server at a URL, and the list of its connections (one entry per accept)."""
    accepted: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted))
        await handler(reader, writer)

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()




def chunked(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request on the connection with a small JSON body, keeping it open."""
    while True:
        try:
            await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: 2\r\n\r\n{}")
        await writer.drain()


async def chunks(response: Http1Response) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive."""
    while chunk := await response.read_chunk():
        yield chunk


async def post(pool: Http1Pool, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await pool.post(url + "/v1/completions", body,
                               {"content-type": "application/json"})
    try:
        return response.status, await response.aread()
    finally:
        await response.aclose()


async def test_the_request_is_exactly_the_bytes_given() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    # The headers every leg carries first (given once), then the leg's own.
    pool = Http1Pool(TIMEOUT, {"authorization": "Bearer k"}, keepalive_expiry=2.0)
    async with tcp_server(answer) as (url, _):
        response = await pool.post(url + "/v1/chat/completions?x=1", '{"p":"é"}'.encode(),
                                   {"x-request-id": "r-1"})
        assert response.status == 204 and await response.aread() == b""
        await response.aclose()
    await pool.aclose()
    host = url.removeprefix("http://")
    assert seen == [f"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: {host}\r\n"
                    "authorization: Bearer k\r\nx-request-id: r-1\r\n"
                    "content-length: 10\r\n\r\n".encode() + '{"p":"é"}'.encode()]


async def test_a_connection_read_to_its_end_is_reused() -> None:
    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(keep_answering) as (url, accepted):
        for _ in range(3):
            assert await post(pool, url) == (200, b"{}")
    await pool.aclose()
    assert len(accepted) == 1


async def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    pool = Http1Pool(TIMEOUT, keepalive_expiry=0.05)
    async with tcp_server(keep_answering) as (url, accepted):
        assert await post(pool, url) == (200, b"{}")
        await asyncio.sleep(0.1)
        assert await post(pool, url) == (200, b"{}")
    await pool.aclose()
    assert len(accepted) == 2


async def test_concurrent_requests_each_get_their_own_connection() -> None:
    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(keep_answering) as (url, accepted):
        answers = await asyncio.gather(*(post(pool, url) for _ in range(5)))
        assert answers == [(200, b"{}")] * 5
        assert await post(pool, url) == (200, b"{}")  # one of the five, back from the pool
    await pool.aclose()
    assert len(accepted) == 5


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(once) as (url, accepted):
        assert await post(pool, url) == (200, b"{}")
        assert await post(pool, url) == (200, b"{}")
    await pool.aclose()
    assert len(accepted) == 2


async def test_a_body_closed_early_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
        await writer.drain()
        if await reader.read(1) == b"":
            closed.set()

    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(endless) as (url, _):
        response = await pool.post(url + "/v1/completions", b"{}", {})
        async for chunk in chunks(response):
            assert chunk == EVENT
            break
        await response.aclose()
        await asyncio.wait_for(closed.wait(), 5)
    await pool.aclose()


async def test_a_body_delimited_by_the_connections_end_is_whole() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(until_close) as (url, _):
        assert await post(pool, url) == (200, b"all of it")
    await pool.aclose()


async def test_garbage_instead_of_an_answer_is_a_protocol_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()

    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(garbage) as (url, _):
        with pytest.raises(UpstreamBroken, match="invalid HTTP response"):
            await post(pool, url)
    await pool.aclose()


async def test_a_stream_that_goes_silent_is_a_read_timeout_after_its_chunks() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
        await writer.drain()
        await asyncio.sleep(3)

    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    got = []
    async with tcp_server(stalls) as (url, _):
        response = await pool.post(url + "/v1/completions", b"{}", {})
        with pytest.raises(UpstreamTimeout, match="no data for 0.5 s"):
            async for chunk in chunks(response):
                got.append(chunk)
        await response.aclose()
    await pool.aclose()
    assert got == [EVENT]


async def test_a_slow_reader_gets_every_byte_and_the_socket_pauses() -> None:
    events = [b"data: %06d %s\n\n" % (i, b"y" * 1000) for i in range(1000)]  # ~1 MB

    async def fast(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     + chunked(*events))
        await writer.drain()
        await keep_answering(reader, writer)

    pool = Http1Pool(TIMEOUT, keepalive_expiry=2.0)
    async with tcp_server(fast) as (url, accepted):
        response = await pool.post(url + "/v1/completions", b"{}", {})
        await asyncio.sleep(0.2)  # the whole answer has arrived or is held by the kernel
        exchange = response._exchange
        assert exchange._paused and exchange._buffered < 2 * 256 * 1024
        body = b"".join([chunk async for chunk in chunks(response)])
        await response.aclose()
        assert body == b"".join(events)
        assert await post(pool, url) == (200, b"{}")  # on the same connection, from the pool
    await pool.aclose()
    assert len(accepted) == 1


async def test_an_https_url_is_refused_by_the_pool() -> None:
    with pytest.raises(ValueError, match="http://"):
        await Http1Pool(TIMEOUT).post("https://node/v1/completions", b"{}", {})


async def test_idle_connections_are_closed_after_their_expiry_without_more_traffic() -> None:
    closed = asyncio.Event()

    async def once_then_watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        if await reader.read(1) == b"":  # the client closed its idle connection
            closed.set()

    pool = Http1Pool(TIMEOUT, keepalive_expiry=0.05)
    async with tcp_server(once_then_watch) as (url, _):
        assert await post(pool, url) == (200, b"{}")
        await asyncio.wait_for(closed.wait(), 2)
    assert not pool._idle and pool._sweep_timer is None
    await pool.aclose()
