"""Every metric the shipped Grafana dashboard and Prometheus alert rules read is one a live
proxy exports: a proxy under policy live (KV events from a fake publisher, /metrics from fake
nodes, so every family it can have is there) serves a few turns - a forced readback that
falls back, a D that fails over - and its /metrics is scraped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.kv_events import BlockStored
from proxy.live.kv_subscriber import KvEventSource
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.deploy.promql import DASHBOARD, alert_expressions, dashboard_queries, metric_names
from tests.fakes.fake_kv_publisher import FakeKvPublisher
from tests.fakes.fake_vllm import FakeVLLM

NODE_METRICS = "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n" \
               "vllm:kv_cache_usage_perc 0.4\n"
COSTS = {"base_ms": 5.0, "per_prefill_token_ms": 0.05, "per_decode_seq_ms": 0.02,
         "transfer_ms_per_ktoken": 0.3, "source": "round numbers for the test"}
ADMIN = {"authorization": "Bearer adm"}


def test_the_parser_finds_metric_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.9, sum by (le, route) (rate(a_bucket{x="y z"}'
            '[$__rate_interval]))) / on (node) group_left (role) b_total offset 5m > 1e-9'
            ' and bool c:d')
    assert metric_names(expr) == {"a_bucket", "b_total", "c:d"}


def test_the_dashboard_has_the_panels_the_issue_asks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    for wanted in ("Route mix", "Turn-2+ TTFT p50 by route", "Fallbacks by reason",
                   "KV event batches per node", "Sessions with known residency per node",
                   "Requests running per node (vLLM)", "Live sessions"):
        assert wanted in titles
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(panel.get("targets") for panel in dashboard["panels"] if panel["type"] != "row")


async def _scrape_a_busy_live_proxy(tmp_path: Path) -> str:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS))
    publisher = FakeKvPublisher()
    try:
        async with FakeVLLM("p") as p, FakeVLLM("d1") as d1, FakeVLLM("d2") as d2:
            for node in (p, d1, d2):
                node.metrics_text = NODE_METRICS
            config = ProxyConfig(
                nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d1.url, Role.DECODE),
                       NodeSpec(d2.url, Role.DECODE)),
                policy=PolicyConfig(kind=Policy.LIVE, live_costs=costs), port=0,
                metrics_interval=0.05, admin_key="adm",
                kv_events=(KvEventSource(d1.url, publisher.endpoint),))
            app = create_app(config)
            live = app.extensions["ppd"].live
            async with running(app) as server, httpx.AsyncClient(timeout=30) as client:
                url = f"{server.url}/v1/chat/completions"
                body = {"model": "fake-model", "max_tokens": 8, "stream": True,
                        "messages": [{"role": "user", "content": "hello there"}]}
                first = await client.post(url, json=body)
                session = first.headers["x-ppd-session"]
                while live.residency.node(d1.url).held_tokens(session) is None:
                    publisher.publish([BlockStored((1, 2), None, 32, 16, session)])
                    await asyncio.sleep(0.02)
                while live.signals.get(d2.url) is None:
                    await asyncio.sleep(0.02)
                follow = {**body, "messages": [*body["messages"],
                                               {"role": "assistant", "content": "hi"},
                                               {"role": "user", "content": "more"}]}
                await client.post(url, json=follow)
                await client.post(url, json=follow, headers={"x-ppd-route": "readback", **ADMIN})
                d1.fail_with(503)
                d2.fail_with(503)
                await client.post(url, json={**body, "messages": [
                    {"role": "user", "content": "no D answers this one"}]})
                return (await client.get(f"{server.url}/metrics")).text
    finally:
        publisher.close()


async def test_every_dashboard_query_and_alert_reads_metrics_a_live_proxy_exports(
        tmp_path: Path) -> None:
    exposition = await _scrape_a_busy_live_proxy(tmp_path)
    exported = {sample.name for family in text_string_to_metric_families(exposition)
                for sample in family.samples}
    queries = {**{f"dashboard: {k}": v for k, v in dashboard_queries().items()},
               **{f"alert: {k}": v for k, v in alert_expressions().items()}}
    assert len(queries) > 30
    missing = {}
    for where, expr in queries.items():
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        if names - exported:
            missing[where] = sorted(names - exported)
    assert not missing, f"queries naming series the proxy does not export: {missing}"
