"""Operator logs: the access line, JSON format, quiet httpx, node state reasons, start-up."""

from __future__ import annotations

import io
import json
import logging
import socket
from pathlib import Path

import httpx
import pytest

from proxy.config.cluster_file import NodeSpec
from proxy.config.config_files import ConfigError
from proxy.config.policy_config import Policy
from proxy.config.settings import config_from_args
from proxy.observability.logs import ACCESS_LOGGER, AccessEntry, LogFormat, configure
from proxy.serving.server import serve_app
from proxy.shared.vocabulary import Role
from proxy.upstream.health import HealthMonitor
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, reply_text, serve_proxy


def access_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOGGER]


@pytest.mark.parametrize("stream", [False, True])
async def test_one_access_line_per_request_with_route_reason_and_timings(
        cluster: dict[str, FakeVLLM], caplog: pytest.LogCaptureFixture, stream: bool) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        first = await proxy.client.post("/v1/chat/completions",
                                        json=chat_body("Hello", stream=stream))
        second = await proxy.client.post(
            "/v1/chat/completions", json=chat_body("Hello", reply_text(first), "next",
                                                   stream=stream))
    assert second.status_code == 200
    records = access_lines(caplog)
    assert len(records) == 2
    turn1, turn2 = (r.fields for r in records)  # type: ignore[attr-defined]
    assert (turn1["turn"], turn1["route"], turn1["reason"]) == (1, "pd", "turn1")
    assert (turn2["turn"], turn2["route"], turn2["reason"]) == (2, "local", "policy")
    assert turn1["session"] == turn2["session"] == second.headers["x-ppd-session"]
    assert turn1["prefill"] in (cluster["p1"].url, cluster["p2"].url)
    assert turn2["decode"] == turn1["decode"] and "prefill" not in turn2
    assert turn2["status"] == 200 and turn2["stream"] is stream
    assert 0 < turn2["ttft_ms"] <= turn2["duration_ms"]
    assert turn2["completion_tokens"] > 0
    text = records[1].getMessage()
    assert text.startswith("POST /v1/chat/completions 200 ")
    assert "route=local" in text and "reason=policy" in text and "turn=2" in text


async def test_a_failed_request_is_logged_with_its_status_and_error(
        cluster: dict[str, FakeVLLM], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        await proxy.client.post("/v1/chat/completions", json=chat_body("Hi"))
        response = await proxy.client.post("/v1/chat/completions",
                                           json={**chat_body("Hi"), "model": "other"})
    assert response.status_code == 404
    entry = access_lines(caplog)[-1].fields  # type: ignore[attr-defined]
    assert entry["status"] == 404 and "other" in entry["error"]


async def test_a_table_decision_logs_its_cell(
        cluster: dict[str, FakeVLLM], caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    from tests.proxy.serving.test_app import two_turns, write_table

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    table = write_table(tmp_path / "t.csv", local_wins=True)
    async with serve_proxy(config_for(cluster, Policy.PPD, table=table)) as proxy:
        await two_turns(proxy.client)
    entry = access_lines(caplog)[-1].fields  # type: ignore[attr-defined]
    assert (entry["route"], entry["reason"], entry["cell"]) == ("local", "table", "small/tiny/1")


def test_json_format_puts_the_access_fields_at_top_level() -> None:
    out = io.StringIO()
    handler = configure("info", LogFormat.JSON, stream=out)
    try:
        entry = AccessEntry("/v1/completions", session="s1", turn=3, route="pd", reason="draw",
                            status=200, ttft_ms=12.5, duration_ms=40.0)
        entry.emit()
        entry.emit()  # once only
    finally:
        logging.getLogger().removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    document = json.loads(lines[0])
    assert document["logger"] == ACCESS_LOGGER and document["level"] == "info"
    assert (document["route"], document["reason"], document["turn"]) == ("pd", "draw", 3)
    assert document["time"].endswith("Z")


def test_configure_silences_httpx_request_lines() -> None:
    out = io.StringIO()
    handler = configure("debug", "text", stream=out)
    try:
        logging.getLogger("httpx").info("HTTP Request: GET http://x/health 200")
        logging.getLogger("ppd.proxy").debug("kept")
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)
    assert "HTTP Request" not in out.getvalue()
    assert "kept" in out.getvalue()


def test_log_flags_parse_and_reject_unknown_values() -> None:
    config = config_from_args(["--prefill", "http://p:1", "--decode", "http://d:2",
                               "--log-level", "debug", "--log-format", "json"])
    assert (config.log_level, config.log_format) == ("debug", "json")
    with pytest.raises(SystemExit):
        config_from_args(["--prefill", "http://p:1", "--decode", "http://d:2",
                          "--log-format", "xml"])


@pytest.mark.parametrize("url", ["http://host:8100/v1", "http://host:8100/v1/"])
def test_a_base_url_ending_in_v1_is_refused_with_the_fix(url: str) -> None:
    with pytest.raises(ConfigError, match=r"ends in /v1.*http://host:8100\b"):
        NodeSpec(url, Role.DECODE)


async def test_node_state_changes_are_logged_with_their_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    from proxy.upstream.backends import BackendPool

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    async with FakeVLLM("d1") as fake:
        pool = BackendPool((NodeSpec(dead, Role.PREFILL), NodeSpec(fake.url, Role.DECODE)))
        async with httpx.AsyncClient() as client:
            monitor = HealthMonitor(pool, client, interval=60)
            caplog.set_level(logging.WARNING, logger="ppd.proxy.health")
            await monitor.check_all()
            fake.health_status = 503
            await monitor.check_all()
            fake.health_status = 200
            await monitor.check_all()
    messages = [r.getMessage() for r in caplog.records]
    assert any(dead in m and "unhealthy" in m and "connection refused" in m for m in messages)
    assert any(fake.url in m and "unhealthy: /health answered 503" in m for m in messages)
    assert any(fake.url in m and "is now healthy" in m for m in messages)


def test_a_busy_port_fails_before_anything_is_announced() -> None:
    announced: list[str] = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match="cannot listen"):
            serve_app(object(), "127.0.0.1", port, on_ready=lambda s: announced.append(s.url))
    assert announced == []


async def test_metrics_have_vllm_style_latency_histograms_and_no_created_series(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        first = await proxy.client.post("/v1/chat/completions",
                                        json=chat_body("Hello", stream=True))
        await proxy.client.post("/v1/chat/completions",
                                json=chat_body("Hello", reply_text(first), "next", stream=True))
        text = (await proxy.client.get("/metrics")).text
    assert "_created" not in text
    for name in ("ppd_time_to_first_token_seconds", "ppd_e2e_request_latency_seconds",
                 "ppd_request_time_per_output_token_seconds"):
        assert f'{name}_count{{route="local"}} 1.0' in text, name
        assert f'{name}_count{{route="pd"}} 1.0' in text, name
    for name in ("ppd_node_healthy", "ppd_node_in_flight", "ppd_requests_in_flight"):
        assert f"# TYPE {name} gauge" in text


async def test_a_request_refused_before_routing_gets_an_access_line_too(
        cluster: dict[str, FakeVLLM], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with serve_proxy(config_for(cluster, Policy.PD, api_key="k")) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("Hi"))
    assert response.status_code == 401
    (entry,) = [r.fields for r in access_lines(caplog)]  # type: ignore[attr-defined]
    assert entry["status"] == 401 and "API key" in entry["error"]


async def test_a_stream_the_client_abandons_is_logged_when_it_closes(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import contextlib

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with contextlib.AsyncExitStack() as stack:
        nodes = {"p1": await stack.enter_async_context(FakeVLLM("p1")),
                 "d1": await stack.enter_async_context(
                     FakeVLLM("d1", reply=" ".join(["word"] * 200), chunk_delay_s=0.02))}
        async with serve_proxy(config_for(nodes, Policy.PD)) as proxy:
            body = chat_body("Hi", stream=True, max_tokens=200)
            async with proxy.client.stream("POST", "/v1/chat/completions", json=body) as reply:
                async for _ in reply.aiter_bytes():
                    break  # the client goes away after the first chunk
            for _ in range(200):
                if access_lines(caplog):
                    break
                await asyncio.sleep(0.02)
    (entry,) = [r.fields for r in access_lines(caplog)]  # type: ignore[attr-defined]
    assert entry["status"] == 200 and entry["route"] == "pd"
    assert "closed before the end" in entry["error"]
    assert "completion_tokens" not in entry


async def test_a_stream_that_breaks_is_logged_with_the_failure(
        cluster: dict[str, FakeVLLM], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    for name in ("d1", "d2"):
        cluster[name].faults.die_after_chunks = 2
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        reply = await proxy.client.post("/v1/chat/completions",
                                        json=chat_body("Hi", stream=True))
    assert reply.status_code == 200 and '"error"' in reply.text  # the in-band error event
    (entry,) = [r.fields for r in access_lines(caplog)]  # type: ignore[attr-defined]
    assert entry["status"] == 200 and entry["error"].startswith("failed mid-stream")


@pytest.mark.parametrize("fmt", [LogFormat.TEXT, LogFormat.JSON])
def test_the_direct_access_line_is_the_line_the_logging_module_writes(
        fmt: LogFormat, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from proxy.observability import logs

    def entry() -> AccessEntry:
        return AccessEntry("/v1/chat/completions", stream=True, session="s1", turn=2,
                           route="local", reason="live", decode="http://d:1", status=200,
                           ttft_ms=3.25, duration_ms=9.5, completion_tokens=16)

    out = io.StringIO()
    handler = configure("info", fmt, stream=out)
    try:
        with monkeypatch.context() as patch:  # the direct path must not touch the logger
            patch.setattr(logs._access, "log", lambda *a, **k: pytest.fail("logger used"))
            entry().emit()
        handler.addFilter(lambda record: True)  # a filter: the logging module's path
        entry().emit()
        failed = entry()
        failed.status, failed.error = 502, 'backend "d" down'
        handler.filters.clear()
        failed.emit()
    finally:
        logging.getLogger().removeHandler(handler)
    direct, via_logging, warning = out.getvalue().splitlines()
    stamp = (r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} " if fmt is LogFormat.TEXT
             else r'"time": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"')
    assert re.search(stamp, direct) and re.search(stamp, via_logging)
    assert re.sub(stamp, "", direct) == re.sub(stamp, "", via_logging)
    if fmt is LogFormat.TEXT:
        assert re.sub(stamp, "", warning).startswith("WARNING ppd.access: POST ")
    else:
        assert json.loads(warning)["level"] == "warning"
        assert json.loads(warning)["error"] == 'backend "d" down'


def test_an_extra_handler_gets_the_access_record_too() -> None:
    out, extra = io.StringIO(), io.StringIO()
    handler = configure("info", "text", stream=out)
    also = logging.StreamHandler(extra)
    logging.getLogger(ACCESS_LOGGER).addHandler(also)
    try:
        AccessEntry("/v1/completions", route="pd", status=200).emit()
    finally:
        logging.getLogger(ACCESS_LOGGER).removeHandler(also)
        logging.getLogger().removeHandler(handler)
    assert "route=pd" in out.getvalue() and "route=pd" in extra.getvalue()
