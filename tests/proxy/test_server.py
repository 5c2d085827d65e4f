"""`proxy.server`: the app's lifespan runs around serving, on either server."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from proxy.lifespan import LifespanError
from proxy.server import ServerKind, running


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
    from proxy.server import listen

    sock = listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
