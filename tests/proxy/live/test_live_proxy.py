"""Policy live behind the real proxy: KV events from a fake publisher, /metrics from a fake D.

A session D holds stays local (reason live); once D evicted part of its history the next turn
goes P->D with reason `evicted`; a session D's events never named is decided blind
(`live_blind`); the proxy's metrics count each, and /stats and /metrics show the events'
health per node. D's legs carry the session
id in vLLM's `session_id` field, which is what makes D's events name the session.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.kv_events import BlockRemoved, BlockStored
from proxy.live.kv_subscriber import KvEventSource
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.fakes.fake_kv_publisher import FakeKvPublisher
from tests.fakes.fake_vllm import FakeVLLM

# A D with 200 requests in its batch: re-prefilling a whole history there delays all of them.
BUSY_D = "vllm:num_requests_running 200\nvllm:num_requests_waiting 0\n" \
         "vllm:kv_cache_usage_perc 0.9\n"
COSTS = {"base_ms": 5.0, "per_prefill_token_ms": 0.05, "per_decode_seq_ms": 0.02,
         "transfer_ms_per_ktoken": 0.3, "source": "round numbers for the test"}
LONG_MESSAGE = " ".join(["word"] * 800)  # ~1,000 tokens of history at ~4 characters a token


async def _until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_evicted_session_goes_p_to_d_and_resident_one_stays_local(tmp_path: Path) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS))
    publisher = FakeKvPublisher()
    try:
        async with FakeVLLM("p") as p, FakeVLLM("d") as d:
            d.metrics_text = BUSY_D
            config = ProxyConfig(
                nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                policy=PolicyConfig(kind=Policy.LIVE, live_costs=costs), port=0,
                metrics_interval=0.05,
                kv_events=(KvEventSource(d.url, publisher.endpoint),))
            app = create_app(config)
            live = app.extensions["ppd"].live
            async with running(app) as server, httpx.AsyncClient(timeout=30) as client:
                url = f"{server.url}/v1/chat/completions"
                await _until(lambda: live.signals.get(d.url) is not None)
                messages = [{"role": "user", "content": LONG_MESSAGE}]
                body = {"model": "fake-model", "max_tokens": 8, "messages": messages,
                        "conversation_id": "conv"}
                first = await client.post(url, json=body)
                assert first.headers["x-ppd-route"] == "pd"
                session = first.headers["x-ppd-session"]
                assert d.completions[-1].body["session_id"] == session

                # D stored the whole history under the session (vLLM tags it, 0.32+).
                index = live.residency.node(d.url)
                while index.held_tokens(session) is None:
                    publisher.publish([BlockStored(tuple(range(1, 201)), None, 200 * 16, 16,
                                                   session)])
                    await asyncio.sleep(0.02)

                def follow(reply: httpx.Response, text: str) -> dict[str, object]:
                    messages.append({"role": "assistant",
                                     "content": reply.json()["choices"][0]["message"]["content"]})
                    messages.append({"role": "user", "content": text})
                    return {**body, "messages": list(messages)}

                second = await client.post(url, json=follow(first, "and then?"))
                assert second.headers["x-ppd-route"] == "local"
                assert d.completions[-1].body["session_id"] == session

                publisher.publish([BlockRemoved((3,))])  # evicted: 32 tokens held
                await _until(lambda: index.held_tokens(session) == 32)
                third = await client.post(url, json=follow(second, "go on"))
                assert third.headers["x-ppd-route"] == "pd"

                stats = (await client.get(f"{server.url}/stats")).json()
                assert stats["reasons"]["live"] == 1 and stats["reasons"]["evicted"] == 1
                exposition = (await client.get(f"{server.url}/metrics")).text
                assert 'reason="evicted"' in exposition

                # KV-event health: what shows that events arrive and residency is known.
                health = stats["kv_events"][d.url]
                assert health["events"] >= 2 and health["batches"] >= 2
                assert health["last_seq"] == publisher.seq - 1
                assert 0 <= health["last_batch_age_s"] < 5
                assert health["sessions_known"] == 1 and health["rejected"] == {}
                assert health["memory_bytes"] > 0
                node = f'node="{d.url}"'
                assert f"ppd_kv_events_received_total{{{node}}}" in exposition
                assert f"ppd_kv_residency_sessions{{{node}}} 1.0" in exposition
                assert f'ppd_kv_events_rejected_total{{{node},reason="cycle"}} 0.0' \
                    in exposition

                # A conversation D's events never named: live decides blind, and says so.
                other = {**body, "conversation_id": "other",
                         "messages": [{"role": "user", "content": "hello"}]}
                reply = await client.post(url, json=other)
                other["messages"] = [*other["messages"],
                                     {"role": "assistant", "content": reply.json()["choices"][
                                         0]["message"]["content"]},
                                     {"role": "user", "content": "more"}]
                await client.post(url, json=other)
                stats = (await client.get(f"{server.url}/stats")).json()
                assert stats["reasons"]["live_blind"] == 1
    finally:
        publisher.close()
