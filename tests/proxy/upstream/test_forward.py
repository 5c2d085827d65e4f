"""The HTTP legs: each request is sent once (no error proves a node never received it), 4xx
come back as answers, 5xx and broken bodies as errors, non-streamed bodies read whole.

Through the tests' seam: `proxy.upstream.httpx_legs.HttpxLegs` over an `httpx.MockTransport`."""

from __future__ import annotations

import httpx
import pytest

from proxy.shared.errors import (
    ProxyError,
    UpstreamBroken,
    UpstreamError,
    UpstreamProtocol,
    UpstreamRefused,
    UpstreamStatus,
    UpstreamTimeout,
)
from proxy.shared.validate import Endpoint
from proxy.upstream import forward
from proxy.upstream.httpx_legs import HttpxLegs
from proxy.upstream.legs import LegTimeouts

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def over(transport: httpx.AsyncBaseTransport) -> HttpxLegs:
    """The legs through a mock network."""
    return HttpxLegs(transport, LegTimeouts(connect=5.0, read=5.0))


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
    with pytest.raises((UpstreamError, UpstreamTimeout)) as raised:
        await getattr(forward, leg)(over(transport), "http://n", Endpoint.CHAT, BODY, "id-1")
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
    legs = over(_answering(200, b'{"ok": true}'))
    answer = await forward.fetch(legs, "http://d", Endpoint.CHAT, BODY, "id-1")
    assert (answer.status, answer.body, answer.rejected) == (200, b'{"ok": true}', False)
    with pytest.raises(UpstreamError, match="ReadError") as raised:
        await forward.fetch(over(_answering(200, _CutBody())), "http://d", Endpoint.CHAT,
                            BODY, "id-1")
    assert type(raised.value) is UpstreamBroken


async def test_a_stream_cut_after_its_first_chunk_raises_the_proxys_error() -> None:
    stream = await forward.open_stream(over(_answering(200, _CutBody())), "http://d",
                                       Endpoint.CHAT, BODY, "id-1")
    assert isinstance(stream, forward.UpstreamStream)
    assert (await stream.next_chunk()).startswith(b'{"choices"')
    with pytest.raises(UpstreamBroken, match="backend http://d/v1/chat/completions failed: "
                                             "ReadError: connection reset by peer"):
        await stream.next_chunk()
    assert not stream.at_end
    await stream.aclose()


async def test_every_leg_carries_the_legs_headers_and_its_own() -> None:
    seen: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={"ok": True})

    legs = HttpxLegs(httpx.MockTransport(handler), LegTimeouts(connect=1.0, read=2.0),
                     {"authorization": "Bearer backend-key"})
    await forward.fetch(legs, "http://d", Endpoint.CHAT, BODY, "id-7")
    assert (seen[0]["authorization"], seen[0]["x-request-id"], seen[0]["content-type"]) == (
        "Bearer backend-key", "id-7", "application/json")


@pytest.mark.parametrize("leg", ["prefill", "open_stream", "fetch"])
async def test_4xx_is_an_answer_and_5xx_an_error(leg: str) -> None:
    call = getattr(forward, leg)
    answer = await call(over(_answering(422, b'{"error": "bad"}')), "http://n", Endpoint.CHAT,
                        BODY, "id-1")
    assert isinstance(answer, forward.Answer)
    assert (answer.status, answer.body, answer.rejected) == (422, b'{"error": "bad"}', True)
    with pytest.raises(UpstreamError, match="answered 503: overloaded") as raised:
        await call(over(_answering(503, b"overloaded")), "http://n", Endpoint.CHAT, BODY,
                   "id-1")
    assert type(raised.value) is UpstreamStatus and raised.value.kind == "status"


async def test_prefill_returns_ps_params_or_none() -> None:
    with_params = _answering(200, b'{"kv_transfer_params": {"remote_block_ids": [7]}}')
    result = await forward.prefill(over(with_params), "http://p", Endpoint.CHAT, BODY, "id-1")
    assert result == forward.Prefilled({"remote_block_ids": [7]})
    result = await forward.prefill(over(_answering(200, b'{"choices": []}')), "http://p",
                                   Endpoint.CHAT, BODY, "id-1")
    assert result == forward.Prefilled(None)
    with pytest.raises(UpstreamError, match="non-JSON") as raised:
        await forward.prefill(over(_answering(200, b"<html>")), "http://p", Endpoint.CHAT,
                              BODY, "id-1")
    assert type(raised.value) is UpstreamProtocol and raised.value.kind == "protocol"
