"""Security edges: authenticated discovery, static nodes out of heartbeats' reach, keys compared
in constant time, /sessions for admins only, header values that cannot inject, and no request
that makes the proxy contact (or tell a node to contact) anything but its registered nodes."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

import httpx
import msgpack
import pytest

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, create_app
from proxy.config.config_files import ConfigError
from proxy.config.policy_config import Policy
from proxy.upstream import register
from proxy.upstream.backends import BackendPool, Source
from proxy.upstream.discovery import REJECTION_LOG_INTERVAL_S, Discovery, heartbeat
from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.mock_vllm import MockCluster
from tests.proxy.helpers import FakeClock, chat_body, config_for, reply_text, serve_proxy

TOKEN = "s3cret-token"


def beat(url: str, role: str = "decode", **extra: Any) -> bytes:
    return msgpack.packb({"type": role, "url": url, **extra})


# ---- discovery -------------------------------------------------------------------------

def test_with_a_token_only_heartbeats_carrying_it_register_a_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr("proxy.upstream.discovery.hmac.compare_digest", spy)
    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 10.0, FakeClock(), token=TOKEN)
    discovery.handle(beat("http://rogue:1"))
    discovery.handle(beat("http://rogue:2"), b"guess")
    discovery.handle(beat("http://rogue:3", token=TOKEN))  # in the map: not where it counts
    discovery.handle(msgpack.packb({"type": "D", "http_address": "rogue:4"}))
    assert pool.nodes() == [] and discovery.rejected == 4
    discovery.handle(beat("http://good:1"), TOKEN.encode())
    discovery.handle(msgpack.packb(heartbeat(Role.PREFILL, "http://legacy:9", [], legacy=True)),
                     TOKEN.encode())
    assert sorted(n.url for n in pool.nodes()) == ["http://good:1", "http://legacy:9"]
    assert (b"guess", TOKEN.encode()) in compared  # the constant-time comparison decided


def test_a_heartbeat_never_changes_a_static_nodes_role_health_or_lifetime() -> None:
    clock = FakeClock()
    pool = BackendPool([NodeSpec("http://d1:1", Role.DECODE)], clock=clock)
    static = pool.get("http://d1:1")
    assert static is not None
    static.healthy = False  # the health checks say it is down
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 5.0, clock, insecure=True)
    discovery.handle(beat("http://d1:1", "prefill"))
    discovery.handle(beat("http://d1:1", "decode", models=["m"]))
    clock.now += 3600  # heartbeats stop for an hour
    assert discovery.expire() == []
    node = pool.get("http://d1:1")
    assert node is static and node.role is Role.DECODE and node.source is Source.STATIC
    assert not node.healthy  # a heartbeat does not overrule the health checks
    assert discovery.rejected == 1


async def test_a_forged_heartbeat_never_rewrites_a_node_given_by_flag(
        cluster: dict[str, FakeVLLM]) -> None:
    # Issue 23, item 1: P2pNccl heartbeats naming the flag-given P and D (loopback only) must
    # not give them a zmq address (where P2pNccl sends the KV) or a model list.
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    config = replace(config_for(nodes, Policy.PD), discovery="tcp://127.0.0.1:0",
                     discovery_insecure=True)
    async with serve_proxy(config) as proxy:
        discovery = proxy.state.discovery
        assert discovery is not None
        for kind, name, zmq_address in (("P", "p1", "127.6.6.6:9"), ("D", "d1", "127.7.7.7:9")):
            http_address = cluster[name].url.removeprefix("http://")
            port = http_address.rpartition(":")[2]
            # Also its twins: a trailing slash, and other names of the same loopback port.
            for address in (http_address, http_address + "/", f"localhost:{port}",
                            f"127.1:{port}", f"[::1]:{port}"):
                discovery.handle(msgpack.packb({"type": kind, "http_address": address,
                                                "zmq_address": zmq_address}))
            discovery.handle(beat(cluster[name].url, "prefill" if kind == "P" else "decode",
                                  models=["evil"]))
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        models = (await proxy.client.get("/v1/models")).json()["data"]
        pool = proxy.state.pool
    assert response.status_code == 200
    request_id = cluster["p1"].completions[-1].headers["x-request-id"]
    assert "127.6.6.6" not in request_id and "127.7.7.7" not in request_id
    assert [m["id"] for m in models] == ["fake-model"]
    assert sorted(n.url for n in pool.nodes()) == sorted([cluster["p1"].url, cluster["d1"].url])
    assert all(n.zmq_address is None and n.models == ("fake-model",) and n.source is Source.STATIC
               for n in pool.nodes())


def test_a_discovered_add_never_changes_a_static_node() -> None:
    pool = BackendPool([NodeSpec("http://127.0.0.1:8100", Role.PREFILL)])
    static = pool.get("http://127.0.0.1:8100")
    assert static is not None
    static.models = ("m",)
    for url in ("http://127.0.0.1:8100", "http://127.0.0.1:8100/"):
        pool.add(url, Role.DECODE, source=Source.DISCOVERED, zmq_address="127.6.6.6:9",
                 models=["evil"], now=5.0)
        pool.add(url, Role.PREFILL, source=Source.DISCOVERED, zmq_address="127.6.6.6:9",
                 models=["evil"], now=5.0)
    assert pool.nodes() == [static]
    assert (static.role, static.zmq_address, static.models, static.source) == (
        Role.PREFILL, None, ("m",), Source.STATIC)


def test_a_flood_of_rejected_heartbeats_logs_one_line_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    discovery = Discovery(BackendPool(), "tcp://127.0.0.1:0", 10.0, clock, token=TOKEN)
    with caplog.at_level(logging.WARNING, logger="ppd.proxy.discovery"):
        for _ in range(1000):
            discovery.handle(beat("http://rogue:1"))
        clock.now += REJECTION_LOG_INTERVAL_S
        discovery.handle(beat("http://rogue:1"))
    assert discovery.rejected == 1001
    assert [r.getMessage().endswith(f"({n} rejected so far)")
            for r, n in zip(caplog.records, (1, 1001), strict=True)] == [True, True]


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:7000", "tcp://*:7000", "tcp://10.1.2.3:7000",
                                     "tcp://[::]:7000", "tcp://eth0:7000", "tcp://127.0.0.1:7000",
                                     "tcp://localhost:7000", "tcp://[::1]:7000"])
def test_discovery_needs_a_token_or_an_explicit_opt_in_on_loopback_too(address: str) -> None:
    with pytest.raises(ConfigError, match="discovery-token"):
        ProxyConfig(discovery=address)
    assert ProxyConfig(discovery=address, discovery_token=TOKEN).discovery == address
    assert ProxyConfig(discovery=address, discovery_insecure=True).discovery == address


def test_without_a_token_a_loopback_registration_is_refused_unless_insecure() -> None:
    pool = BackendPool()
    Discovery(pool, "tcp://127.0.0.1:0", 10.0, FakeClock()).handle(beat("http://127.0.0.1:9"))
    assert pool.nodes() == []
    Discovery(pool, "tcp://127.0.0.1:0", 10.0, FakeClock(), insecure=True).handle(
        beat("http://127.0.0.1:9"))
    assert [n.url for n in pool.nodes()] == ["http://127.0.0.1:9"]


@pytest.mark.parametrize("alias", ["http://localhost:8100", "http://127.1:8100",
                                   "http://[::1]:8100", "http://0.0.0.0:8100/",
                                   "http://127.0.0.1:8100/", "http://[::ffff:127.0.0.1]:8100"])
def test_a_url_that_names_a_configured_node_is_that_node(alias: str) -> None:
    pool = BackendPool([NodeSpec("http://127.0.0.1:8100", Role.DECODE)])
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 10.0, FakeClock(), insecure=True)
    discovery.handle(beat(alias, "prefill"))  # an alias cannot take the prefill role
    discovery.handle(beat(alias, "decode"))  # nor join beside it
    assert [(n.url, n.role, n.source) for n in pool.nodes()] == [
        ("http://127.0.0.1:8100", Role.DECODE, Source.STATIC)]
    assert pool.static_twin("http://127.0.0.1:8101") is None


async def test_ppd_register_sends_the_token_from_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 60.0, FakeClock(), token=TOKEN)
    address = discovery.bind()
    task = asyncio.create_task(discovery.run())
    try:
        sends = [["--url", "http://flag:1", "--token", TOKEN], ["--url", "http://none:1"]]
        for argv in sends:
            await asyncio.to_thread(register.main, ["--proxy", address, "--role", "decode",
                                                    "--count", "1", *argv])
        monkeypatch.setenv("PPD_DISCOVERY_TOKEN", TOKEN)
        await asyncio.to_thread(register.main, ["--proxy", address, "--role", "prefill",
                                                "--count", "1", "--url", "http://env:1"])
        for _ in range(200):
            if len(pool.nodes()) + discovery.rejected >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sorted(n.url for n in pool.nodes()) == ["http://env:1", "http://flag:1"]
    assert discovery.rejected == 1


# ---- keys and admin endpoints ---------------------------------------------------------

async def test_sessions_is_off_without_an_admin_key_and_needs_it_otherwise(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        await proxy.client.post("/v1/chat/completions", json=chat_body("private"))
        off = await proxy.client.get("/sessions")
    assert off.status_code == 404 and "--admin-key" in off.json()["error"]["message"]
    assert "private" not in off.text
    async with serve_proxy(replace(config_for(cluster, Policy.PD), admin_key="adm")) as proxy:
        denied = await proxy.client.get("/sessions", headers={"authorization": "Bearer api"})
        allowed = await proxy.client.get("/sessions", headers={"authorization": "Bearer adm"})
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
    assert allowed.status_code == 200


async def test_api_and_admin_keys_are_compared_in_constant_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[bytes] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr("proxy.shared.validate.hmac.compare_digest", spy)
    async with in_process(api_key="api-key", admin_key="admin-key") as (client, _):
        wrong = await client.post("/v1/chat/completions", json=chat_body("x"),
                                  headers={"authorization": "Bearer api-kez"})
        right = await client.post("/v1/chat/completions", json=chat_body("x"),
                                  headers={"authorization": "Bearer api-key"})
        forced = await client.post("/v1/chat/completions", json=chat_body("x"),
                                   headers={"authorization": "Bearer admin-key",
                                            "x-ppd-route": "pd"})
    assert (wrong.status_code, right.status_code, forced.status_code) == (401, 200, 200)
    assert set(compared) == {b"api-key", b"admin-key"}


# ---- what reaches the nodes ------------------------------------------------------------

class Recorder(httpx.AsyncBaseTransport):
    """Every request the proxy makes, then MockCluster's answer (unknown hosts: refused)."""

    def __init__(self, cluster: MockCluster) -> None:
        self.cluster = cluster
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self.cluster.transport.handle_async_request(request)


@contextlib.asynccontextmanager
async def in_process(policy: Policy = Policy.PD, **overrides: Any,
                     ) -> AsyncIterator[tuple[Any, Recorder]]:
    """The app in process (Quart test client) over p1, d1, d2 behind a Recorder."""
    cluster = MockCluster("p1", "d1", "d2")
    nodes = tuple(NodeSpec(n.url, Role.PREFILL if name[0] == "p" else Role.DECODE)
                  for name, n in cluster.nodes.items())
    recorder = Recorder(cluster)
    config = ProxyConfig(nodes=nodes, policy=PolicyConfig(policy), port=0, health_interval=600,
                         **overrides)
    app = create_app(config, transport=recorder)
    async with app.test_app() as test_app:
        yield test_app.test_client(), recorder


STEERING_HEADERS = {
    "host": "evil.example:6666", "x-forwarded-host": "evil.example",
    "x-forwarded-for": "10.6.6.6", "x-forwarded-proto": "https", "x-forwarded-port": "6666",
    "forwarded": "for=10.6.6.6;host=evil.example;proto=https", "x-real-ip": "10.6.6.6",
    "x-original-url": "http://evil.example/v1/chat/completions",
}
STEERING_PARAMS = {"do_remote_prefill": True, "remote_host": "evil.example", "remote_port": 6666,
                   "remote_engine_id": "evil", "remote_block_ids": [0]}


@pytest.mark.parametrize("policy", [Policy.PD, Policy.LOCAL])
async def test_no_request_makes_the_proxy_or_a_node_contact_an_unregistered_host(
        policy: Policy) -> None:
    async with in_process(policy) as (client, recorder):
        first = await client.post("/v1/chat/completions", headers=STEERING_HEADERS,
                                  json=chat_body("hi", kv_transfer_params=STEERING_PARAMS))
        answer = json.loads(await first.get_data())["choices"][0]["message"]["content"]
        second = await client.post("/v1/chat/completions", headers=STEERING_HEADERS,
                                   json=chat_body("hi", answer, "more",
                                                  kv_transfer_params=STEERING_PARAMS))
        completions = [r for r in recorder.requests if r.method == "POST"]
    assert first.status_code == second.status_code == 200
    assert {r.url.host for r in recorder.requests} <= {"p1", "d1", "d2"}
    assert len(completions) >= 3  # P and D for turn 1, at least D for turn 2
    for request in completions:
        sent = json.loads(request.content)
        assert "evil" not in json.dumps(sent.get("kv_transfer_params")), sent
        assert request.headers["host"] == request.url.netloc.decode()  # the node's, not ours
        assert not {k.lower() for k in request.headers} & {*STEERING_HEADERS, "authorization"} \
            - {"host"}


async def test_the_clients_authorization_never_reaches_a_node() -> None:
    for backend_key in (None, "node-key"):
        async with in_process(api_key="client-secret", backend_api_key=backend_key) as (
                client, recorder):
            response = await client.post("/v1/chat/completions", json=chat_body("x"),
                                         headers={"authorization": "Bearer client-secret"})
        assert response.status_code == 200
        sent = [r.headers.get("authorization") for r in recorder.requests]
        assert sent and all(a == (f"Bearer {backend_key}" if backend_key else None)
                            for a in sent), sent


@pytest.mark.parametrize("conversation_id", ["smile \U0001F600 caf\u00e9", "100% sure"])
async def test_a_client_chosen_session_id_is_percent_encoded_in_headers(
        cluster: dict[str, FakeVLLM], conversation_id: str) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body(
            "x", conversation_id=conversation_id, stream=True))
        latin1 = "caf\u00e9 %".encode("latin-1")
        by_header = await proxy.client.post("/v1/chat/completions", json=chat_body("y"),
                                            headers={"x-session-id": latin1})
    assert response.status_code == 200 and reply_text(response)
    assert "x-evil" not in response.headers
    assert response.headers["x-ppd-session"].isascii()
    assert unquote(response.headers["x-ppd-session"]) == conversation_id
    assert unquote(by_header.headers["x-ppd-session"]) == "caf\u00e9 %"


def test_ppd_register_help_never_shows_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PPD_DISCOVERY_TOKEN", TOKEN)
    assert TOKEN not in register.build_parser().format_help()


@pytest.mark.parametrize("conversation_id", ["a\r\nx-evil: 1", "tab\tand\x00nul", "x" * 257])
async def test_a_session_id_no_header_can_carry_is_refused_naming_the_limit(
        cluster: dict[str, FakeVLLM], conversation_id: str) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body(
            "x", conversation_id=conversation_id))
        # A header cannot carry control characters at all (the HTTP parser refuses them).
        by_header = await proxy.client.post("/v1/chat/completions", json=chat_body("y"),
                                            headers={"x-session-id": "y" * 300})
    assert response.status_code == 400 and "x-evil" not in response.headers
    error = response.json()["error"]
    assert error["param"] == "conversation_id"
    assert ("limit of 256" in error["message"]) if len(conversation_id) > 256 \
        else ("control character" in error["message"])
    assert by_header.status_code == 400
    assert by_header.json()["error"]["param"] == "x-session-id"
    assert "limit of 256" in by_header.json()["error"]["message"]


async def test_request_headers_over_16_kb_get_431(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        huge = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                       headers={"x-padding": "a" * 1024 * 1024})
        stats = await proxy.client.get("/stats", headers={"x-padding": "a" * 20_000})
        fine = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                       headers={"x-padding": "a" * 8_000})
    assert huge.status_code == 431 and stats.status_code == 431
    assert "16384-byte limit" in huge.json()["error"]["message"]
    assert fine.status_code == 200


async def test_vllm_internal_fields_never_reach_a_node_and_priority_needs_the_admin_key(
        cluster: dict[str, FakeVLLM]) -> None:
    fields = {"request_id": "fixed-id", "data_parallel_rank": 1, "priority": -10}
    async with serve_proxy(config_for(cluster, Policy.PD, admin_key="adm")) as proxy:
        client = await proxy.client.post("/v1/chat/completions", json=chat_body("x", **fields))
        admin = await proxy.client.post("/v1/chat/completions", json=chat_body("y", **fields),
                                        headers={"authorization": "Bearer adm"})
    assert client.status_code == 200 and admin.status_code == 200
    legs = [leg.body for fake in cluster.values() for leg in fake.completions]
    assert legs and all("request_id" not in body and "data_parallel_rank" not in body
                        for body in legs)
    priorities = [body.get("priority") for body in legs]
    assert priorities.count(-10) == 2  # the admin's request: its P leg and its D leg
    assert priorities.count(None) == len(legs) - 2
