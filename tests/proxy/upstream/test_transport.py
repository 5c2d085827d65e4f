"""`proxy.upstream.transport.DefaultLegs`: `http://` legs on `proxy.upstream.http1`, every other
scheme on
aiohttp's pool (the failure moments every implementation shares are in test_legs.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from proxy.shared.errors import UpstreamRefused
from proxy.upstream.legs import LegTimeouts
from proxy.upstream.transport import DefaultLegs
from tests.proxy.raw_http import read_request

TIMEOUT = LegTimeouts(connect=5.0, read=0.5)


async def test_an_http_leg_goes_through_http1_which_knows_the_bodys_end() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"content-length: 13\r\n\r\ndata: first\n\n")
        await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    legs = DefaultLegs(TIMEOUT, {})
    try:
        response = await legs.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
        assert await response.read_chunk() == b"data: first\n\n"
        # Only proxy.upstream.http1 knows it (the relay's [DONE] with the end).
        assert response.at_end
        await response.aclose()
    finally:
        await legs.aclose()
        server.close()


async def test_an_https_leg_goes_through_aiohttp() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket closes
    legs = DefaultLegs(TIMEOUT, {})
    # proxy.upstream.http1 would refuse the scheme itself (ValueError); aiohttp tries to connect.
    with pytest.raises(UpstreamRefused, match=f"https://127.0.0.1:{port}/v1/completions"):
        await legs.post(f"https://127.0.0.1:{port}/v1/completions", b"{}", {})
    await legs.aclose()
