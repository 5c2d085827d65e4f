"""`proxy.serving.server`: the app's lifespan runs around serving, on either server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import httpx
import pytest

from proxy.serving.lifespan import LifespanError
from proxy.serving.server import ServerKind, running


class App:
    """An ASGI app that records its lifespan and answers every request with 'ok'."""

    def __init__(self, fail_startup: bool = False) -> None:
        self.fail_startup = fail_startup
        self.events: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.events.append(message["type"])
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.failed", "message": "no table"}
                               if self.fail_startup else {"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("kind", list(ServerKind))
async def test_startup_runs_before_serving_and_shutdown_after(kind: ServerKind) -> None:
    app = App()
    async with running(app, server=kind) as server:
        assert app.events == ["lifespan.startup"]
        async with httpx.AsyncClient() as client:
            assert (await client.get(server.url + "/")).text == "ok"
    assert app.events == ["lifespan.startup", "lifespan.shutdown"]


async def test_a_failing_startup_raises_with_the_apps_message() -> None:
    with pytest.raises(LifespanError, match="no table"):
        async with running(App(fail_startup=True)):
            pass


async def test_an_app_without_lifespan_is_served() -> None:
    async def bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise RuntimeError("http only")
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with running(bare) as server, httpx.AsyncClient() as client:
        assert (await client.get(server.url + "/")).status_code == 204


async def test_reuse_port_lets_two_servers_share_a_port() -> None:
    first_app, second_app = App(), App()
    async with running(first_app, reuse_port=True) as first, \
            running(second_app, port=first.port, reuse_port=True) as second:
        assert second.port == first.port
        async with httpx.AsyncClient() as client:
            assert (await client.get(second.url + "/")).text == "ok"
    assert second_app.events == first_app.events == ["lifespan.startup", "lifespan.shutdown"]


async def test_a_taken_port_without_reuse_port_is_a_clear_error() -> None:
    async with running(App()) as first:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            async with running(App(), port=first.port):
                pass


def test_the_listening_socket_says_it_is_tcp_so_connections_get_nodelay() -> None:
    # asyncio sets TCP_NODELAY on accepted sockets only when proto is TCP; with proto 0 every
    # small write of a reply waited for the client's delayed ACK (40 ms per non-streamed reply).
    from proxy.serving.server import listen

    sock = listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


# ---- slow clients (issue 23, item 7): headers and body have a deadline -------------------

async def _dribble(port: int, data: bytes, interval: float, limit: float,
                   prefix: bytes = b"") -> tuple[float, bytes]:
    """On a raw socket, send prefix at once, then data one byte per interval; (seconds until
    the server closed the connection, what it answered), about `limit` s if it never did."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(prefix)
    started = time.monotonic()
    answer = b""
    try:
        for byte in data:
            try:
                writer.write(bytes([byte]))
                await writer.drain()
                chunk = await asyncio.wait_for(reader.read(65536), interval)
            except TimeoutError:
                continue
            except OSError:
                break
            answer += chunk
            if not chunk or time.monotonic() - started > limit:
                break
        return time.monotonic() - started, answer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


SLOW_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + b"x-slow: " + b"a" * 200


async def test_a_client_sending_one_header_byte_at_a_time_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.serving.http_server.HEADER_TIMEOUT_S", 1.0, raising=False)
    async with running(App()) as server:
        results = await asyncio.gather(*(_dribble(server.port, SLOW_HEADERS, 0.1, 6.0)
                                         for _ in range(20)))
        async with httpx.AsyncClient() as client:  # the server still serves everyone else
            assert (await client.get(server.url + "/")).text == "ok"
    for elapsed, answer in results:
        assert elapsed < 3.0, elapsed  # dropped after the 1 s header deadline, not 6 s later
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b'"error"' in answer


async def test_a_client_that_connects_and_sends_nothing_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As long as an idle connection.
    monkeypatch.setattr("proxy.serving.http_server.KEEP_ALIVE_S", 1.0)
    async with running(App()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            answer = await asyncio.wait_for(reader.read(), 5.0)  # times out if never closed
        finally:
            writer.close()
    assert answer == b""  # closed quietly: a 408 could be taken for a just-sent request's


async def test_a_client_sending_its_body_one_byte_at_a_time_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[bytes] = []

    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                received.append(b"disconnect")
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    monkeypatch.setattr("proxy.serving.http_server.BODY_TIMEOUT_S", 1.0, raising=False)
    request = (b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"b" * 100)
    headers, body = request.split(b"\r\n\r\n")
    async with running(echo) as server:
        # The headers arrive at once, the body byte by byte: dropped at the body deadline.
        elapsed, answer = await _dribble(server.port, body, 0.1, 6.0, headers + b"\r\n\r\n")
        async with httpx.AsyncClient() as client:
            fast = await client.post(server.url + "/", content=b"quick")
    assert fast.text == "quick"
    assert elapsed < 3.0, elapsed
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert received == [b"disconnect"]


