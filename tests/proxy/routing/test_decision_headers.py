"""Decisions a client can read, through the real proxy over fake nodes: every routed reply says
why it took its route (x-ppd-reason), one whose decided or forced route did not serve it says
why not (x-ppd-fallback), the admin alone is shown the costs the policy weighed
(x-ppd-costs), and the access line carries the same."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.config.policy_config import Policy
from proxy.shared.explain import parse_costs
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, reply_text, serve_proxy
from tests.proxy.serving.test_app import write_table

ADMIN = {"authorization": "Bearer adm"}
URL = "/v1/chat/completions"


async def test_every_reply_says_why_it_took_its_route(cluster: dict[str, FakeVLLM]) -> None:
    pair = {name: cluster[name] for name in ("p1", "d1")}
    async with serve_proxy(config_for(pair, Policy.LOCAL)) as proxy:
        first = await proxy.client.post(URL, json=chat_body("Hello"))
        second = await proxy.client.post(
            URL, json=chat_body("Hello", reply_text(first), "more", stream=True))
        cluster["d1"].fail_with(400)
        rejected = await proxy.client.post(URL, json=chat_body("refused"))
        cluster["d1"].fail_with(503)
        failed = await proxy.client.post(URL, json=chat_body("no D answers"))
    assert (first.headers["x-ppd-route"], first.headers["x-ppd-reason"]) == ("pd", "turn1")
    assert second.headers["content-type"].startswith("text/event-stream")
    assert (second.headers["x-ppd-route"], second.headers["x-ppd-reason"]) == ("local",
                                                                                "policy")
    # A node's refusal and a turn no node could serve still say what was decided.
    assert rejected.status_code == 400 and rejected.headers["x-ppd-reason"] == "turn1"
    assert failed.status_code == 502 and failed.headers["x-ppd-reason"] == "turn1"
    for reply in (first, second, rejected, failed):
        assert "x-ppd-fallback" not in reply.headers
        assert "x-ppd-costs" not in reply.headers  # pd and local weigh nothing


async def test_a_forced_readback_that_falls_back_says_readback_missing(
        cluster: dict[str, FakeVLLM]) -> None:
    # No --kv-readback-ttl: no D keeps blocks to read back, so a readback turn goes P->D.
    async with serve_proxy(config_for(cluster, Policy.PD, admin_key="adm")) as proxy:
        first = await proxy.client.post(URL, json=chat_body("Hello"))
        forced = await proxy.client.post(URL, json=chat_body("Hello", reply_text(first), "more"),
                                         headers={"x-ppd-route": "readback", **ADMIN})
        plain = await proxy.client.post(URL, json=chat_body("Hello", reply_text(first), "again"),
                                        headers={"x-ppd-route": "pd", **ADMIN})
        homeless = await proxy.client.post(URL, json=chat_body("a new one"),
                                           headers={"x-ppd-route": "local", **ADMIN})
        metrics = (await proxy.client.get("/metrics")).text
    assert forced.status_code == 200
    assert forced.headers["x-ppd-route"] == "pd"
    assert forced.headers["x-ppd-fallback"] == "readback_missing"
    assert forced.headers["x-ppd-reason"] == "readback_missing"
    assert (plain.headers["x-ppd-route"], plain.headers["x-ppd-reason"]) == ("pd", "forced")
    assert "x-ppd-fallback" not in plain.headers
    # Turn 1 forced local: nothing to append to, so P->D.
    assert homeless.headers["x-ppd-route"] == "pd"
    assert homeless.headers["x-ppd-fallback"] == "no_home"
    assert 'ppd_fallbacks_total{reason="readback_missing",route="readback"} 1.0' in metrics
    assert 'ppd_fallbacks_total{reason="no_home",route="local"} 1.0' in metrics


async def test_the_admin_alone_sees_the_costs_the_table_weighed(
        cluster: dict[str, FakeVLLM], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    table = write_table(tmp_path / "t.csv", local_wins=True)
    config = replace(config_for(cluster, Policy.PPD, table=table), admin_key="adm",
                     api_key="user")
    caplog.set_level(logging.INFO, logger="ppd.access")
    async with serve_proxy(config) as proxy:
        user = {"authorization": "Bearer user"}
        first = await proxy.client.post(URL, json=chat_body("Hello"), headers=user)
        history = ("Hello", reply_text(first))
        as_user = await proxy.client.post(URL, json=chat_body(*history, "more"), headers=user)
        as_admin = await proxy.client.post(URL, json=chat_body(*history, "more"),
                                           headers=ADMIN)
    assert as_user.headers["x-ppd-route"] == as_admin.headers["x-ppd-route"] == "local"
    assert as_user.headers["x-ppd-reason"] == as_admin.headers["x-ppd-reason"] == "table"
    assert "x-ppd-costs" not in as_user.headers
    # The table's row for the cell: pd 200 ms / 50 ms, local 100 ms / 50 ms.
    assert parse_costs(as_admin.headers["x-ppd-costs"]) == {
        "pd": {"ttft": 200.0, "tpot": 50.0}, "local": {"ttft": 100.0, "tpot": 50.0}}
    # The access line says it to the operator for every client's turn.
    lines = [r for r in caplog.records if r.name == "ppd.access" and "reason=table" in
             r.getMessage()]
    assert len(lines) == 2
    assert all("costs=pd=ttft:200.0,tpot:50.0;local=ttft:100.0,tpot:50.0" in r.getMessage()
               for r in lines)
    assert lines[0].fields["costs"] == "pd=ttft:200.0,tpot:50.0;local=ttft:100.0,tpot:50.0"


async def test_the_access_line_says_why_a_route_fell_back(
        cluster: dict[str, FakeVLLM], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ppd.access")
    async with serve_proxy(config_for(cluster, Policy.PD, admin_key="adm")) as proxy:
        first = await proxy.client.post(URL, json=chat_body("Hello"))
        await proxy.client.post(URL, json=chat_body("Hello", reply_text(first), "more"),
                                headers={"x-ppd-route": "readback", **ADMIN})
    [line] = [r for r in caplog.records if r.name == "ppd.access" and "turn=2" in r.getMessage()]
    assert "route=pd reason=readback_missing fallback=readback_missing" in line.getMessage()
    assert line.fields["fallback"] == "readback_missing"
