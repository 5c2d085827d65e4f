"""Issue #45's failures 13-16 (the readback path trusted D) replayed against a served `ppd
proxy --policy readback`, each under the bar of tests/proxy/trust/served.py (/health within
1 s, RSS within +200 MB, the steady client served 200). The nodes are
`tests.fakes.mock_vllm.MockNode`s (their D keeps a whole turn's blocks as vLLM's
bidirectional NIXL does, their P tokenizes) on real sockets (`served_mock`):

13. D's readback params forged - 300k block ids, another host, another engine id of 10,000
    characters: they never reach P; the next turn runs plain P->D, served;
14. the readback book: 60 sessions of 50k tokens each (+582 MB once): bounded by
    --readback-book-bytes, oldest first;
15. P declines a readback on a one-P cluster (a 502 once): retried as plain P->D, served;
16. D's NIXL host, port and block ids never reach the client, with `return_token_ids` asked
    and without --kv-readback-ttl.

Here the fix is that the request is served, so "the request in question" gets a 200 that
carries nothing of D's params, and P is asked with D's params only when they are plausible.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from tests.fakes.mock_vllm import Fault, MockNode
from tests.fakes.scripted_node import served_mock
from tests.proxy.trust.served import MIB, ServedProxy, served_proxy, watching

LONG = " ".join(f"word{i}" for i in range(64))  # enough tokens to be worth reading back
D_REPLY = "Hello from d1, a fake node."
# The mock D names this host in its params; on loopback D's URL names 127.0.0.1.
MOCK_D_HOST = b'"remote_host": "10.0.0.2"'
LOOPBACK_HOST = b'"remote_host": "127.0.0.1"'


def on_loopback(body: bytes) -> bytes:
    return body.replace(MOCK_D_HOST, LOOPBACK_HOST)


@contextlib.asynccontextmanager
async def readback_cluster(*flags: str, d_rewrite: Callable[[bytes], bytes] = on_loopback,
                           d: MockNode | None = None
                           ) -> AsyncIterator[tuple[ServedProxy, MockNode, MockNode]]:
    """A served proxy over one mock P and one mock D that keeps readback blocks."""
    p = MockNode("p1")
    d = d or MockNode("d1", keeps_readback=True)
    async with served_mock(p) as p_url, served_mock(d, d_rewrite) as d_url, served_proxy(
            ["--prefill", p_url, "--decode", d_url, *flags]) as proxy:
        yield proxy, p, d


def chat(*contents: str, **extra: Any) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {"model": "fake-model", "max_tokens": 16, **extra,
            "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]}


async def ask(proxy: ServedProxy, body: dict[str, Any]) -> httpx.Response:
    return await asyncio.to_thread(httpx.post, proxy.url + "/v1/chat/completions", json=body,
                                   timeout=60)


def p_reads(p: MockNode) -> list[dict[str, Any]]:
    """The kv_transfer_params of every P leg that asked P to read D's blocks."""
    return [r.body["kv_transfer_params"] for r in p.received
            if "remote_num_tokens" in (r.body.get("kv_transfer_params") or {})]


FORGED = {
    "300k block ids": b'"remote_block_ids": [' + b", ".join(b"%d" % i for i in range(300_000))
                      + b"]",
    "another host": b'"remote_host": "10.6.6.6"',
    "another engine": b'"remote_engine_id": "' + b"e" * 10_000 + b'"',
}


async def test_13_forged_readback_params_never_reach_p() -> None:
    for name, forged in FORGED.items():
        key = forged.split(b":")[0]

        def forge(body: bytes, key: bytes = key, forged: bytes = forged) -> bytes:
            body = on_loopback(body)
            if b'"do_remote_decode": true' not in body:
                return body
            start = body.index(key, body.index(b'"kv_transfer_params"'))
            end = body.index(b"]" if key == b'"remote_block_ids"' else b",", start) + (
                key == b'"remote_block_ids"')
            return body[:start] + forged + body[end:]

        async with readback_cluster("--policy", "readback", "--kv-readback-ttl", "60",
                                    d_rewrite=forge) as (proxy, p, _), watching(proxy):
            first = await ask(proxy, chat(LONG))
            second = await ask(proxy, chat(LONG, D_REPLY, "And then?"))
        assert first.status_code == 200 and second.status_code == 200, name
        assert second.headers["x-ppd-route"] == "pd", name  # nothing plausible to read back
        assert p_reads(p) == [], name


async def test_13_honest_params_do_reach_p() -> None:
    """The counterpart: without forgery the same turns read back (the check is no blanket)."""
    async with readback_cluster("--policy", "readback", "--kv-readback-ttl", "60") as (
            proxy, p, _):
        await ask(proxy, chat(LONG))
        second = await ask(proxy, chat(LONG, D_REPLY, "And then?"))
    assert second.headers["x-ppd-route"] == "readback" and len(p_reads(p)) == 1


async def test_14_sixty_sessions_of_50k_tokens() -> None:
    """With --readback-book-bytes at 8 MB (the default, 64 MiB, holds these 24 MB whole):
    the oldest sessions' entries go, the newest stay. Expiry purging is checked in process
    (test_readback_bounds.py): a served proxy shows no book size."""
    words = " ".join(f"w{i}" for i in range(50_000))
    async with readback_cluster("--policy", "readback", "--kv-readback-ttl", "60",
                                "--readback-book-bytes", str(8 * MIB)) as (proxy, p, _), \
            watching(proxy):
        for i in range(60):
            served = await ask(proxy, chat(f"session {i} {words}"))
            assert served.status_code == 200
        newest = await ask(proxy, chat(f"session 59 {words}", D_REPLY, "And then?"))
        oldest = await ask(proxy, chat(f"session 0 {words}", D_REPLY, "And then?"))
    assert newest.headers["x-ppd-route"] == "readback"
    assert oldest.headers["x-ppd-route"] == "pd"  # dropped for the bytes of newer ones


async def test_15_a_declined_readback_on_a_one_p_cluster_is_plain_pd() -> None:
    async with readback_cluster("--policy", "readback", "--kv-readback-ttl", "60") as (
            proxy, p, _), watching(proxy):
        await ask(proxy, chat(LONG))
        p.script(Fault(), Fault.status(500))  # /tokenize answers, then the read fails
        second = await ask(proxy, chat(LONG, D_REPLY, "And then?"))
        stats = (await asyncio.to_thread(httpx.get, proxy.url + "/stats")).json()
    assert second.status_code == 200 and second.headers["x-ppd-route"] == "pd"
    assert len(p_reads(p)) == 1  # asked once, declined, then P->D
    assert "readback_declined" in json.dumps(stats)


# D's params as the mock sends them (its host left as it is: the proxy's own headers name
# the nodes' loopback URLs).
SECRETS = ("10.0.0.2", "remote_port", "engine-d1", "remote_block_ids", "remote_num_tokens")


async def test_16_ds_kv_params_never_reach_the_client() -> None:
    for flags in (["--policy", "readback", "--kv-readback-ttl", "60"], ["--policy", "local"]):
        async with readback_cluster(*flags, d_rewrite=lambda body: body) as (
                proxy, _, _), watching(proxy):
            answers = [await ask(proxy, chat(LONG, return_token_ids=True)),
                       await ask(proxy, chat(LONG, D_REPLY, "More?", return_token_ids=True)),
                       await ask(proxy, chat("short"))]
        for answer in answers:
            assert answer.status_code == 200
            seen = answer.text + json.dumps(dict(answer.headers))
            leaked = [s for s in SECRETS if s in seen]
            assert not leaked, (flags, leaked, seen[:500])
            assert answer.json().get("kv_transfer_params") is None  # vLLM's own null may stay
        assert "token_ids" in answers[0].json()["choices"][0]  # what the client asked stays
