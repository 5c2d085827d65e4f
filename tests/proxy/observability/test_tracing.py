"""Traces of turns, through the real proxy over fake nodes, exported to the OpenTelemetry SDK's
in-memory exporter: one trace per request - the turn, its decision, each leg - and every leg
carries the W3C traceparent of its own span, so a node's spans join the trace. Without
--otlp-traces-endpoint nothing is traced and opentelemetry is not even imported."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy import ProxyConfig, create_app, running
from proxy.config.config_files import ConfigError
from proxy.config.policy_config import Policy
from proxy.config.settings import config_from_args
from proxy.observability.tracing import TracingUnavailable, open_tracing
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, reply_text

URL = "/v1/chat/completions"


@contextlib.asynccontextmanager
async def traced(config: ProxyConfig) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                             InMemorySpanExporter]]:
    """The proxy with its tracer exporting to memory (what --otlp-traces-endpoint opens,
    with the collector replaced)."""
    exporter = InMemorySpanExporter()
    app = create_app(config)
    app.asgi_app.tracing = open_tracing(None, exporter)  # type: ignore[attr-defined]
    async with running(app) as server, httpx.AsyncClient(base_url=server.url,
                                                         timeout=20) as client:
        yield client, exporter


def _by_name(spans: Any) -> dict[str, Any]:
    return {span.name: span for span in spans}


def _parent_of(headers: dict[str, str]) -> tuple[int, int]:
    """The trace id and parent span id a W3C traceparent header names."""
    version, trace_id, span_id, _flags = headers["traceparent"].split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16)


def _ids(span: Any) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


async def test_a_p_to_d_turn_is_one_trace_of_its_decision_and_both_legs(
        cluster: dict[str, FakeVLLM]) -> None:
    pair = {name: cluster[name] for name in ("p1", "d1")}
    async with traced(config_for(pair, Policy.PD)) as (client, exporter):
        reply = await client.post(URL, json=chat_body("Hello", stream=True))
        assert reply.status_code == 200
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"ppd turn", "ppd decision", "ppd leg prefill", "ppd leg decode"}
    turn = spans["ppd turn"]
    assert len({span.context.trace_id for span in spans.values()}) == 1
    assert all(span.parent.span_id == turn.context.span_id
               for name, span in spans.items() if name != "ppd turn")
    assert turn.parent is None
    assert turn.attributes["ppd.route"] == "pd" and turn.attributes["ppd.reason"] == "turn1"
    assert turn.attributes["http.response.status_code"] == 200
    assert spans["ppd decision"].attributes["ppd.route"] == "pd"
    # Each node got its own leg's span as parent: vLLM's spans hang under it.
    [p_request], [d_request] = pair["p1"].completions, pair["d1"].completions
    assert _parent_of(p_request.headers) == _ids(spans["ppd leg prefill"])
    assert _parent_of(d_request.headers) == _ids(spans["ppd leg decode"])
    assert spans["ppd leg decode"].attributes["url.full"].startswith(pair["d1"].url)
    # The streamed leg's span lasts until its stream ended, inside the turn's.
    decode = spans["ppd leg decode"]
    assert decode.end_time <= turn.end_time and decode.start_time >= turn.start_time


async def test_a_local_turn_has_one_leg_and_a_failed_one_is_marked(
        cluster: dict[str, FakeVLLM]) -> None:
    pair = {name: cluster[name] for name in ("p1", "d1")}
    async with traced(config_for(pair, Policy.LOCAL)) as (client, exporter):
        first = await client.post(URL, json=chat_body("Hello"))
        exporter.clear()
        second = await client.post(URL, json=chat_body("Hello", reply_text(first), "more"))
        local = _by_name(exporter.get_finished_spans())
        exporter.clear()
        pair["d1"].fail_with(503)
        failed = await client.post(URL, json=chat_body("again"))
        broken = exporter.get_finished_spans()
    assert second.headers["x-ppd-route"] == "local"
    assert set(local) == {"ppd turn", "ppd decision", "ppd leg local"}
    assert failed.status_code == 502
    [d_leg] = [span for span in broken if span.name == "ppd leg decode"]
    assert not d_leg.status.is_ok and d_leg.attributes["http.response.status_code"] == 503
    [turn] = [span for span in broken if span.name == "ppd turn"]
    assert turn.attributes["http.response.status_code"] == 502 and not turn.status.is_ok


async def test_the_decision_span_carries_the_costs_weighed(
        cluster: dict[str, FakeVLLM], tmp_path: Any) -> None:
    from tests.proxy.serving.test_app import write_table

    table = write_table(tmp_path / "t.csv", local_wins=True)
    async with traced(config_for(cluster, Policy.PPD, table=table)) as (client, exporter):
        first = await client.post(URL, json=chat_body("Hello"))
        exporter.clear()
        await client.post(URL, json=chat_body("Hello", reply_text(first), "more"))
    decision = _by_name(exporter.get_finished_spans())["ppd decision"]
    assert decision.attributes["ppd.reason"] == "table"
    assert decision.attributes["ppd.costs"] == \
        "pd=ttft:200.0,tpot:50.0;local=ttft:100.0,tpot:50.0"


async def test_without_the_flag_no_leg_carries_a_traceparent(
        cluster: dict[str, FakeVLLM]) -> None:
    pair = {name: cluster[name] for name in ("p1", "d1")}
    app = create_app(config_for(pair, Policy.PD))
    async with running(app) as server, httpx.AsyncClient(base_url=server.url) as client:
        await client.post(URL, json=chat_body("Hello"))
    assert app.asgi_app.tracing is None  # type: ignore[attr-defined]
    assert "traceparent" not in pair["p1"].completions[0].headers


def test_a_proxy_without_the_flag_does_not_import_opentelemetry() -> None:
    code = ("import sys; from proxy import create_app, ProxyConfig, NodeSpec, Role; "
            "create_app(ProxyConfig(nodes=(NodeSpec('http://127.0.0.1:1', Role.PREFILL), "
            "NodeSpec('http://127.0.0.1:2', Role.DECODE)), port=0)); "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_flag_is_vllms_name_and_a_bad_address_is_refused() -> None:
    config = config_from_args(["--prefill", "http://p:1", "--decode", "http://d:1",
                               "--otlp-traces-endpoint", "http://127.0.0.1:4317"])
    assert config.otlp_traces_endpoint == "http://127.0.0.1:4317"
    with pytest.raises(ConfigError, match="--otlp-traces-endpoint"):
        ProxyConfig(otlp_traces_endpoint="http://collector :4317")


def test_without_the_sdk_the_flag_names_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # import fails
    with pytest.raises(TracingUnavailable, match=r"pip install 'ppd\[tracing\]'"):
        open_tracing("http://127.0.0.1:4317")


def test_an_unknown_otlp_protocol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon")
    with pytest.raises(TracingUnavailable, match="carrier-pigeon"):
        open_tracing("http://127.0.0.1:4317")


async def test_the_flag_exports_over_otlp_to_a_collector(
        cluster: dict[str, FakeVLLM], monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakes.otlp_collector import OtlpCollector

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    pair = {name: cluster[name] for name in ("p1", "d1")}
    with OtlpCollector() as collector:
        config = replace(config_for(pair, Policy.PD),
                         otlp_traces_endpoint=collector.traces_url)
        app = create_app(config)
        async with running(app) as server, httpx.AsyncClient(base_url=server.url) as client:
            reply = await client.post(URL, json=chat_body("Hello"))
        # Serving stopped: the batch of spans was flushed to the collector.
        spans = collector.spans()
    assert reply.status_code == 200
    assert {span.name for span in spans} == {"ppd turn", "ppd decision", "ppd leg prefill",
                                             "ppd leg decode"}
    assert {span.service for span in spans} == {"ppd-proxy"}
    assert len({span.trace_id for span in spans}) == 1
    p_parent = _parent_of(pair["p1"].completions[0].headers)
    [prefill] = [span for span in spans if span.name == "ppd leg prefill"]
    assert p_parent == (prefill.trace_id, prefill.span_id)
