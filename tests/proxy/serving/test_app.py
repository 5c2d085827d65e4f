"""The app's contract: forcing header, admin key, sessions by id, policies end to end, metrics."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import httpx

import proxy
from proxy.config.policy_config import Policy
from proxy.policies.table import TABLE_COLUMNS
from tests.exports import assert_exports
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, make_tokenizer, reply_text, serve_proxy


async def two_turns(client: httpx.AsyncClient, headers: dict[str, str] | None = None,
                    first_text: str = "Hello", **extra: object) -> tuple[httpx.Response, ...]:
    first = await client.post("/v1/chat/completions", json=chat_body(first_text, **extra))
    second = await client.post("/v1/chat/completions",
                               json=chat_body(first_text, reply_text(first), "next", **extra),
                               headers=headers or {})
    return first, second


ADMIN = {"authorization": "Bearer adm"}


async def test_forcing_header_overrides_the_policy(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD, admin_key="adm")) as proxy:
        _, forced_local = await two_turns(proxy.client, {"x-ppd-route": "local", **ADMIN})
    assert forced_local.headers["x-ppd-route"] == "local"
    async with serve_proxy(config_for(cluster, Policy.LOCAL, admin_key="adm")) as proxy:
        _, forced_pd = await two_turns(proxy.client, {"x-ppd-route": "pd", **ADMIN})
        turn1 = await proxy.client.post("/v1/chat/completions", json=chat_body("new"),
                                        headers={"x-ppd-route": "local", **ADMIN})
        bad = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                      headers={"x-ppd-route": "fast", **ADMIN})
    assert forced_pd.headers["x-ppd-route"] == "pd"
    assert turn1.headers["x-ppd-route"] == "pd"  # nothing to append to on turn 1
    assert bad.status_code == 400
    assert "x-ppd-route-ignored" not in forced_pd.headers


async def test_without_an_admin_key_the_forcing_header_is_ignored(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        _, second = await two_turns(proxy.client, {"x-ppd-route": "local"})
        odd = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                      headers={"x-ppd-route": "fast"})
    assert second.status_code == 200 and second.headers["x-ppd-route"] == "pd"
    assert "--admin-key" in second.headers["x-ppd-route-ignored"]
    assert odd.status_code == 200  # ignored, whatever it holds


async def test_forcing_and_sessions_need_the_admin_key(cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster, Policy.PD), admin_key="adm")
    async with serve_proxy(config) as proxy:
        denied = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                         headers={"x-ppd-route": "pd"})
        allowed = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                          headers={"x-ppd-route": "pd",
                                                   "authorization": "Bearer adm"})
        sessions_denied = await proxy.client.get("/sessions")
        sessions = await proxy.client.get("/sessions", headers={"authorization": "Bearer adm"})
    assert denied.status_code == 401 and allowed.status_code == 200
    assert sessions_denied.status_code == 401
    assert len(sessions.json()["sessions"]) == 1


async def test_explicit_session_ids_from_header_and_body(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        by_header = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                            headers={"x-session-id": "abc"})
        by_body = await proxy.client.post("/v1/chat/completions",
                                          json=chat_body("x", conversation_id="conv-9"))
    assert by_header.headers["x-ppd-session"] == "abc"
    assert by_body.headers["x-ppd-session"] == "conv-9"


async def test_sessions_spread_over_decode_nodes_least_in_flight(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        homes = [(await proxy.client.post("/v1/chat/completions",
                                          json=chat_body(f"conversation {i}"))
                  ).headers["x-ppd-decode"] for i in range(4)]
    assert sorted(homes) == sorted([cluster["d1"].url, cluster["d2"].url] * 2)


async def test_replica_policy_pins_sessions_and_never_uses_p(
        cluster: dict[str, FakeVLLM]) -> None:
    async with FakeVLLM("r1") as r1, FakeVLLM("r2") as r2:
        nodes = {"p1": cluster["p1"], "r1": r1, "r2": r2}
        async with serve_proxy(config_for(nodes, Policy.REPLICA)) as proxy:
            first, second = await two_turns(proxy.client)
    assert first.headers["x-ppd-route"] == second.headers["x-ppd-route"] == "replica"
    assert first.headers["x-ppd-decode"] == second.headers["x-ppd-decode"]
    assert "x-ppd-prefill" not in second.headers
    assert not cluster["p1"].completions
    assert "kv_transfer_params" not in (r1.completions + r2.completions)[0].body


async def test_threshold_counts_only_the_new_suffix(cluster: dict[str, FakeVLLM]) -> None:
    config = config_for(cluster, Policy.THRESHOLD, non_cached_tokens=20)
    long_history = "word " * 400  # ~500 tokens of history D holds
    async with serve_proxy(config) as proxy:
        _, short_new = await two_turns(proxy.client, first_text=long_history)
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("start"))
        reply = first.json()["choices"][0]["message"]["content"]
        long_new = await proxy.client.post("/v1/chat/completions",
                                           json=chat_body("start", reply, "paste " * 100))
    assert short_new.headers["x-ppd-route"] == "local"
    assert long_new.headers["x-ppd-route"] == "pd"


def write_table(path: Path, local_wins: bool) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(TABLE_COLUMNS))
        writer.writeheader()
        for workload in ("tiny", "short_gen", "small_bal"):
            writer.writerow({"context_class": "small", "workload": workload, "qps": 1.0,
                             "pd_ttft_ms": 200, "pd_tpot_ms": 50, "pd_success": 1,
                             "local_ttft_ms": 100 if local_wins else 300, "local_tpot_ms": 50,
                             "local_success": 1, "n_requests": 10})
    return path


async def test_ppd_policy_routes_by_table_and_labels_metrics(
        cluster: dict[str, FakeVLLM], tmp_path: Path) -> None:
    table = write_table(tmp_path / "t.csv", local_wins=True)
    async with serve_proxy(config_for(cluster, Policy.PPD, table=table)) as proxy:
        _, second = await two_turns(proxy.client)
        metrics = (await proxy.client.get("/metrics")).text
        stats = (await proxy.client.get("/stats")).json()
    assert second.headers["x-ppd-route"] == "local"
    assert ('ppd_requests_total{context_class="small",endpoint="/v1/chat/completions",'
            'qps="1",reason="table",route="local",workload="tiny"} 1.0') in metrics
    assert stats["routes"] == {"pd": 1, "local": 1}
    assert stats["local_share"] == 0.5
    losing = write_table(tmp_path / "t2.csv", local_wins=False)
    async with serve_proxy(config_for(cluster, Policy.PPD, table=losing)) as proxy:
        _, second = await two_turns(proxy.client)
    assert second.headers["x-ppd-route"] == "pd"


async def test_metrics_stats_and_health(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        await two_turns(proxy.client, stream=True)
        metrics = await proxy.client.get("/metrics")
        stats = (await proxy.client.get("/stats")).json()
        health = await proxy.client.get("/health")
    text = metrics.text
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "ppd_sessions_live 1.0" in text
    assert 'ppd_time_to_first_token_seconds_count{route="local"} 1.0' in text
    assert 'ppd_time_to_first_token_seconds_count{route="pd"} 1.0' in text
    assert "ppd_turn_index_count 2.0" in text
    assert 'ppd_responses_total{status="200"} 2.0' in text
    assert stats["requests"] == 2 and stats["sessions_live"] == 1 and stats["request_rate"] > 0
    assert stats["request_rate_unit"] == "requests (turns)/s"
    assert "qps" not in stats  # removed: request_rate (README, Upgrade notes)
    assert stats["reasons"] == {"turn1": 1, "policy": 1}
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_public_api_is_small_and_sorted() -> None:
    assert_exports(proxy, {
        "ConfigError", "DecisionTable", "NodeSpec", "Policy", "PolicyConfig", "ProxyConfig",
        "ProxyError", "Role", "RouteKind", "Server", "ServerThread", "TABLE_COLUMNS",
        "TableError", "Workload", "config_from_args", "create_app", "running", "serve"})


async def test_tokenizer_dir_counts_the_new_messages_exactly(
        cluster: dict[str, FakeVLLM], tmp_path: Path) -> None:
    from proxy.shared.tokens import EstimateTokenCounter, HFTokenCounter

    directory = make_tokenizer(tmp_path / "tok")
    new = "how are you today"
    exact = HFTokenCounter(directory).count(new)
    assert exact != EstimateTokenCounter().count(new)  # the test can tell them apart
    routes = []
    for limit in (exact, exact - 1):
        config = replace(config_for(cluster, Policy.THRESHOLD, non_cached_tokens=limit),
                         tokenizer=directory)
        async with serve_proxy(config) as proxy:
            first = await proxy.client.post("/v1/chat/completions", json=chat_body("Hello"))
            second = await proxy.client.post("/v1/chat/completions", json=chat_body(
                "Hello", reply_text(first), new))
        routes.append(second.headers["x-ppd-route"])
    assert routes == ["local", "pd"]


async def test_health_is_503_exactly_when_no_route_can_be_served() -> None:
    # Issue 23, item 2: circuits count. Poison requests (every D answers 500) open nothing and
    # /health stays 200; resets on both Ds from different requests open both circuits: 503
    # while they are open, 200 again once the cool-down lets a probe through.
    from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role
    from tests.fakes.mock_vllm import Fault, MockCluster
    from tests.proxy.helpers import FakeClock

    cluster = MockCluster("p1", "d1", "d2")
    nodes = tuple(NodeSpec(n.url, Role.PREFILL if name[0] == "p" else Role.DECODE)
                  for name, n in cluster.nodes.items())
    clock = FakeClock(100.0)
    config = ProxyConfig(nodes=nodes, policy=PolicyConfig(Policy.PD), port=0,
                         health_interval=600, breaker_failures=1, breaker_cooldown=10.0)
    app = proxy.create_app(config, transport=cluster.transport, clock=clock)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for i in range(3):
            cluster["d1"].script(Fault.status(500))
            cluster["d2"].script(Fault.status(500))
            poison = await client.post("/v1/chat/completions", json=chat_body(f"poison {i}"))
            assert poison.status_code == 502
        after_poison = await client.get("/health")
        served = await client.post("/v1/chat/completions", json=chat_body("someone else"))
        for name in ("d1", "d2"):  # two requests, each reset by the D it reached first
            cluster["d1"].script(Fault.reset())
            cluster["d2"].script(Fault.reset())
            await client.post("/v1/chat/completions", json=chat_body(f"reset {name}"))
        down = await client.get("/health")
        down_body = await down.get_json()
        circuits = {n["url"]: n["circuit"] for n in down_body["nodes"]}
        refused = await client.post("/v1/chat/completions", json=chat_body("while open"))
        clock.now += 10.0
        back = await client.get("/health")
    assert after_poison.status_code == 200 and served.status_code == 200
    assert circuits == {"http://p1": "closed", "http://d1": "open", "http://d2": "open"}
    assert down.status_code == 503 and down_body["status"] == "unavailable"
    assert refused.status_code == 503
    assert back.status_code == 200
