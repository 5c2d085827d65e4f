"""The HTTP legs: each request is sent once (no error proves a node never received it), 4xx
come back as answers, 5xx and broken bodies as errors, non-streamed bodies read whole."""

from __future__ import annotations

import httpx
import pytest

from proxy import forward
from proxy.errors import (
    ProxyError,
    UpstreamBroken,
    UpstreamError,
    UpstreamProtocol,
    UpstreamRefused,
    UpstreamStatus,
    UpstreamTimeout,
)
from proxy.validate import Endpoint

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _failing(error: type[httpx.TransportError]) -> tuple[httpx.MockTransport, list[str]]:
    """A node that fails every request with error, recording the X-Request-Id it was sent."""
    received: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        received.append(request.headers["x-request-id"])
        raise error("fails on cue", request=request)

    return httpx.MockTransport(handler), received


# A reset or a read error may come after the server read the whole request and started the
# completion; resending it would run it twice. A refused connection is the node being down.
@pytest.mark.parametrize(("error", "failure"), [
    (httpx.ReadError, UpstreamBroken),
    (httpx.RemoteProtocolError, UpstreamBroken),
    (httpx.WriteError, UpstreamBroken),
    (httpx.ReadTimeout, UpstreamTimeout),
    (httpx.ConnectError, UpstreamRefused),
])
@pytest.mark.parametrize("leg", ["prefill", "open_stream", "fetch"])
async def test_a_failed_request_is_not_resent(leg: str, error: type[httpx.TransportError],
                                              failure: type[ProxyError]) -> None:
    transport, received = _failing(error)
    async with httpx.AsyncClient(transport=transport) as client:
        call = getattr(forward, leg)
        with pytest.raises((UpstreamError, UpstreamTimeout)) as raised:
            await call(client, "http://n", Endpoint.CHAT, BODY, "id-1")
    assert type(raised.value) is failure
    assert received == ["id-1"]


def _answering(status: int, content: bytes | httpx.AsyncByteStream) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(content, bytes):
            return httpx.Response(status, content=content,
                                  headers={"content-type": "application/json"})
        return httpx.Response(status, stream=content,
                              headers={"content-type": "application/json"})

    return httpx.MockTransport(handler)


class _CutBody(httpx.AsyncByteStream):
    """Half a JSON document, then the connection dies."""

    async def __aiter__(self):  # type: ignore[override]
        yield b'{"choices": [{"index": 0, "message": {"content": "Hal'
        raise httpx.ReadError("connection reset by peer")


async def test_fetch_reads_the_whole_body_or_fails() -> None:
    async with httpx.AsyncClient(transport=_answering(200, b'{"ok": true}')) as client:
        answer = await forward.fetch(client, "http://d", Endpoint.CHAT, BODY, "id-1")
    assert (answer.status, answer.body, answer.rejected) == (200, b'{"ok": true}', False)
    async with httpx.AsyncClient(transport=_answering(200, _CutBody())) as client:
        with pytest.raises(UpstreamError, match="ReadError"):
            await forward.fetch(client, "http://d", Endpoint.CHAT, BODY, "id-1")


@pytest.mark.parametrize("leg", ["prefill", "open_stream", "fetch"])
async def test_4xx_is_an_answer_and_5xx_an_error(leg: str) -> None:
    call = getattr(forward, leg)
    async with httpx.AsyncClient(transport=_answering(422, b'{"error": "bad"}')) as client:
        answer = await call(client, "http://n", Endpoint.CHAT, BODY, "id-1")
    assert isinstance(answer, forward.Answer)
    assert (answer.status, answer.body, answer.rejected) == (422, b'{"error": "bad"}', True)
    async with httpx.AsyncClient(transport=_answering(503, b"overloaded")) as client:
        with pytest.raises(UpstreamError, match="answered 503: overloaded") as raised:
            await call(client, "http://n", Endpoint.CHAT, BODY, "id-1")
    assert type(raised.value) is UpstreamStatus and raised.value.kind == "status"


async def test_prefill_returns_ps_params_or_none() -> None:
    with_params = _answering(200, b'{"kv_transfer_params": {"remote_block_ids": [7]}}')
    async with httpx.AsyncClient(transport=with_params) as client:
        result = await forward.prefill(client, "http://p", Endpoint.CHAT, BODY, "id-1")
    assert result == forward.Prefilled({"remote_block_ids": [7]})
    async with httpx.AsyncClient(transport=_answering(200, b'{"choices": []}')) as client:
        result = await forward.prefill(client, "http://p", Endpoint.CHAT, BODY, "id-1")
    assert result == forward.Prefilled(None)
    async with httpx.AsyncClient(transport=_answering(200, b"<html>")) as client:
        with pytest.raises(UpstreamError, match="non-JSON") as raised:
            await forward.prefill(client, "http://p", Endpoint.CHAT, BODY, "id-1")
    assert type(raised.value) is UpstreamProtocol and raised.value.kind == "protocol"
