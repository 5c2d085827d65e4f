"""The HTTP legs: a request that got no response on a (stale) pooled connection is sent once
more before the node is blamed; a second failure is an UpstreamError."""

from __future__ import annotations

import httpx
import pytest

from proxy import forward
from proxy.errors import UpstreamError
from proxy.validate import Endpoint

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _flaky(failures: int) -> tuple[httpx.MockTransport, list[int]]:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) <= failures:
            raise httpx.ReadError("connection reset by peer", request=request)
        return httpx.Response(200, json={"kv_transfer_params": {"remote_block_ids": [7]}},
                              headers={"content-type": "application/json"})

    return httpx.MockTransport(handler), calls


@pytest.mark.parametrize("leg", ["prefill", "open_stream"])
async def test_one_stale_connection_error_is_retried(leg: str) -> None:
    transport, calls = _flaky(failures=1)
    async with httpx.AsyncClient(transport=transport) as client:
        if leg == "prefill":
            kv = await forward.prefill(client, "http://p", Endpoint.CHAT, BODY, "id-1")
            assert kv == {"remote_block_ids": [7]}
        else:
            stream = await forward.open_stream(client, "http://d", Endpoint.CHAT, BODY, "id-1")
            assert b"remote_block_ids" in stream.first
            await stream.aclose()
    assert len(calls) == 2


async def test_a_second_failure_is_an_upstream_error() -> None:
    transport, calls = _flaky(failures=2)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(UpstreamError, match="ReadError") as raised:
            await forward.open_stream(client, "http://d", Endpoint.CHAT, BODY, "id-1")
    assert raised.value.kind == "transport" and len(calls) == 2


async def test_a_refused_connection_is_not_retried() -> None:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("connection refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(UpstreamError) as raised:
            await forward.prefill(client, "http://p", Endpoint.CHAT, BODY, "id-1")
    assert raised.value.kind == "connect" and len(calls) == 1
