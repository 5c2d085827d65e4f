"""`proxy.serving.direct`: requests an app serves without ASGI, on uvicorn's connection."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from proxy.serving.responders import DirectApp, Responder
from proxy.serving.server import ServerKind, running


class DirectEcho:
    """POST /direct is served directly: streamed in the chunks the body names (b"a|b|c"),
    or whole with ?whole; anything else goes through ASGI (`asgi_calls` counts them)."""

    def __init__(self, fail: str | None = None, header: bytes = b"ok") -> None:
        self.fail = fail  # "before" or "after" the head: the handler raises there
        self.header = header
        self.asgi_calls = 0
        self.direct_calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.asgi_calls += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"asgi"})

    def direct(self, scope: dict[str, Any]) -> Any:
        return self._serve if (scope["method"], scope["path"]) == ("POST", "/direct") else None

    async def _serve(self, scope: dict[str, Any], receive: Any, responder: Responder) -> None:
        self.direct_calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.fail == "before":
            raise RuntimeError("broken before the head")
        headers = [(b"content-type", b"text/plain"), (b"x-echo", self.header)]
        if scope["query_string"] == b"whole":
            await responder.whole(201, headers, body)
            return
        await responder.head(200, headers)
        pieces = body.split(b"|")
        for piece in pieces[:-1]:
            await responder.chunk(piece, True)
            if self.fail == "after":
                raise RuntimeError("broken mid-stream")
            await asyncio.sleep(0.05)  # each chunk its own packet
        await responder.chunk(pieces[-1], False)


async def _exchange(port: int, raw: bytes, until: bytes = b"0\r\n\r\n",
                    reads: int = 50) -> bytes:
    """Send raw; everything the server wrote until `until` ended it (or the connection
    closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        received = b""
        for _ in range(reads):
            data = await asyncio.wait_for(reader.read(65536), 5.0)
            received += data
            if not data or received.endswith(until):
                break
        return received
    finally:
        writer.close()


def _post(body: bytes, path: str = "/direct", extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n".encode()
            + extra + b"\r\n" + body)


def test_the_completion_app_is_a_direct_app() -> None:
    assert isinstance(DirectEcho(), DirectApp)


async def test_a_streamed_answer_is_chunked_and_its_head_goes_out_with_the_first_chunk(
        ) -> None:
    app = DirectEcho()
    async with running(app) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(_post(b"first|second"))
            # One write for head and first chunk: the loopback delivers it in one read.
            first = await asyncio.wait_for(reader.read(65536), 5.0)
            assert first.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"\r\ntransfer-encoding: chunked\r\n" in first
            assert b"\r\nx-echo: ok\r\n" in first and b"\r\ndate: " in first
            assert first.endswith(b"\r\n\r\n5\r\nfirst\r\n"), first
            rest = await asyncio.wait_for(reader.read(65536), 5.0)
            assert rest == b"6\r\nsecond\r\n0\r\n\r\n"
            # The connection is kept alive: a second request on it is served.
            writer.write(_post(b"again", "/direct?whole"))
            again = await asyncio.wait_for(reader.read(65536), 5.0)
            assert again.startswith(b"HTTP/1.1 201 Created\r\n")
            assert b"\r\ncontent-length: 5\r\n" in again and again.endswith(b"\r\n\r\nagain")
        finally:
            writer.close()
    assert (app.direct_calls, app.asgi_calls) == (2, 0)


async def test_httpx_reads_direct_answers_and_other_requests_go_through_asgi() -> None:
    app = DirectEcho()
    async with running(app) as server, httpx.AsyncClient() as client:
        streamed = await client.post(server.url + "/direct", content=b"a|b|c")
        whole = await client.post(server.url + "/direct?whole", content=b"abc")
        other = await client.post(server.url + "/other", content=b"abc")
        got = await client.get(server.url + "/direct")
    assert (streamed.status_code, streamed.text) == (200, "abc")
    assert (whole.status_code, whole.text, whole.headers["content-length"]) == (201, "abc", "3")
    assert other.text == got.text == "asgi"
    assert (app.direct_calls, app.asgi_calls) == (2, 2)


async def test_pipelined_requests_are_answered_in_order() -> None:
    app = DirectEcho()
    async with running(app) as server:
        answer = await _exchange(server.port, _post(b"one", "/direct?whole")
                                 + _post(b"two", "/direct?whole"), until=b"two")
    assert answer.index(b"\r\n\r\none") < answer.index(b"\r\n\r\ntwo")


async def test_a_client_asking_to_close_gets_connection_close_and_the_end() -> None:
    async with running(DirectEcho()) as server:
        answer = await _exchange(server.port, _post(b"bye", "/direct?whole",
                                                     b"connection: close\r\n"), until=b"")
    assert b"\r\nconnection: close\r\n" in answer and answer.endswith(b"\r\n\r\nbye")


async def test_a_handler_failing_before_it_answers_is_a_500() -> None:
    async with running(DirectEcho(fail="before")) as server:
        answer = await _exchange(server.port, _post(b"x"), until=b"Internal Server Error")
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert b"\r\nconnection: close\r\n" in answer


async def test_a_handler_failing_mid_stream_closes_the_connection_unfinished() -> None:
    async with running(DirectEcho(fail="after")) as server:
        answer = await _exchange(server.port, _post(b"a|b"), until=b"")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"1\r\na\r\n")


@pytest.mark.parametrize("value", [b"split\r\nx-injected: 1", b"nul\x00"])
async def test_a_header_value_that_would_split_the_response_is_a_500(value: bytes) -> None:
    async with running(DirectEcho(header=value)) as server:
        answer = await _exchange(server.port, _post(b"a", "/direct?whole"),
                                 until=b"Internal Server Error")
    assert answer.startswith(b"HTTP/1.1 500 ") and b"x-injected" not in answer


async def test_hypercorn_serves_a_direct_app_through_asgi() -> None:
    app = DirectEcho()
    async with running(app, server=ServerKind.HYPERCORN) as server, \
            httpx.AsyncClient() as client:
        answer = await client.post(server.url + "/direct", content=b"a|b")
    assert answer.text == "asgi" and app.direct_calls == 0
