"""OpenTelemetry traces of turns, exported over OTLP when `--otlp-traces-endpoint` is given.

One trace per completion request: a `ppd turn` span (the request, start to the last byte)
with children for the decision (`ppd decision`: the route, the reason, the costs weighed) and
for each leg sent upstream (`ppd leg prefill`, `ppd leg readback` - the P leg that reads the
history's KV back from D -, `ppd leg decode`, `ppd leg local`, `ppd leg tokenize`), each
with its node, request id and status. Every leg carries W3C `traceparent` (and
`tracestate`): a vLLM node started with its own `--otlp-traces-endpoint` files its
`llm_request` span under the leg's span, in the same trace.

Off unless the flag is given, and then only is opentelemetry imported (`open_tracing`): a
proxy without it pays one context-variable read per leg and per decision. The endpoint
(`proxy.serving.endpoints`) sets the request's `TurnTrace` in a context variable for the request's
task; the decision (`proxy.routing.router`) and the legs (`proxy.upstream.forward`) read it where
they are
(`current()`), with no tracing argument through every call between. The exporter follows
vLLM's: OTLP over gRPC, or over HTTP with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

from proxy.shared.explain import costs_text
from proxy.shared.vocabulary import Decision

SERVICE_NAME = "ppd-proxy"
# vLLM's variable for the OTLP protocol (vllm/tracing/otel.py reads the same, default grpc).
PROTOCOL_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")

_current: ContextVar[TurnTrace | None] = ContextVar("ppd_turn_trace", default=None)


class TracingUnavailable(RuntimeError):
    """--otlp-traces-endpoint was given but the OpenTelemetry packages are not installed."""


def current() -> TurnTrace | None:
    """The trace of the request this task serves (None: tracing is off)."""
    return _current.get()


def activate(trace: TurnTrace) -> Token[TurnTrace | None]:
    """Make `trace` the current one for this task (until `deactivate`)."""
    return _current.set(trace)


def deactivate(token: Token[TurnTrace | None]) -> None:
    """Undo `activate`."""
    _current.reset(token)


class Tracing:
    """The proxy's tracer: one per process, opened when serving starts, shut down (spans
    flushed) when it stops."""

    def __init__(self, provider: Any, propagator: Any) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("ppd.proxy")
        self._propagator = propagator

    def turn(self, path: str) -> TurnTrace:
        """Start the trace of one request to `path` (`activate` makes it the task's)."""
        from opentelemetry.trace import SpanKind

        span = self._tracer.start_span("ppd turn", kind=SpanKind.SERVER,
                                       attributes={"http.route": path})
        return TurnTrace(self, span)

    def shutdown(self) -> None:
        """Flush what is buffered and stop the exporter."""
        self._provider.shutdown()


class TurnTrace:
    """One request's spans: the turn, and children started under it."""

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self._tracing = tracing
        self.span = span
        self.route: str | None = None  # the decided route: names a one-node leg

    def _child(self, name: str, attributes: dict[str, Any]) -> Any:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        context = trace.set_span_in_context(self.span)
        kind = SpanKind.CLIENT if name.startswith("ppd leg") else SpanKind.INTERNAL
        return self._tracing._tracer.start_span(name, context=context, kind=kind,
                                                attributes=attributes)

    def deciding(self) -> DecisionSpan:
        """The decision's span, open until the decision is recorded (`DecisionSpan`)."""
        return DecisionSpan(self, self._child("ppd decision", {}))

    def leg(self, name: str, url: str, request_id: str,
            headers: MutableMapping[str, str]) -> LegSpan:
        """A leg's span; `headers` (the leg's) get its `traceparent`."""
        from opentelemetry import trace

        span = self._child(f"ppd leg {name}", {"ppd.leg": name, "url.full": url,
                                                "ppd.request_id": request_id})
        self._tracing._propagator.inject(headers, context=trace.set_span_in_context(span))
        return LegSpan(span)

    def finish(self, status: int, headers: dict[str, str]) -> None:
        """End the turn with the response's status and what its x-ppd-* headers said."""
        span = self.span
        span.set_attribute("http.response.status_code", status)
        for name, value in headers.items():
            if name.startswith("x-ppd-"):
                span.set_attribute("ppd." + name[6:].replace("-", "_"), value)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"status {status}"))
        span.end()


class DecisionSpan:
    """`with trace.deciding() as decided: ...; decided.record(decision)`: the span covers
    the decision's work (the readback book's answer and the policy's verdict)."""

    def __init__(self, trace: TurnTrace, span: Any) -> None:
        self._trace = trace
        self._span = span

    def __enter__(self) -> DecisionSpan:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if error is not None:
            self._span.record_exception(error)
        self._span.end()

    def record(self, decision: Decision) -> None:
        """The verdict: its route, reason, table cell and the costs weighed."""
        self._trace.route = decision.kind.value
        span = self._span
        span.set_attribute("ppd.route", decision.kind.value)
        span.set_attribute("ppd.reason", decision.reason.value)
        if decision.cell is not None:
            cell = decision.cell
            span.set_attribute("ppd.cell",
                               f"{cell.context_class.value}/{cell.workload}/{cell.qps:g}")
        costs = costs_text(decision.costs)
        if costs is not None:
            span.set_attribute("ppd.costs", costs)


class _NoDecision:
    """What `deciding()` gives when tracing is off: records nothing, costs nothing."""

    def __enter__(self) -> _NoDecision:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def record(self, decision: Decision) -> None:
        return None


_NO_DECISION = _NoDecision()


def deciding() -> DecisionSpan | _NoDecision:
    """The current turn's decision span, or a no-op when tracing is off (the router's
    `with tracing.deciding() as decided:` around its decision)."""
    trace = _current.get()
    return _NO_DECISION if trace is None else trace.deciding()


class LegSpan:
    """One leg's span: ended with the leg's status, or the error that ended it."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def end(self, status: int | None = None, error: BaseException | None = None) -> None:
        span = self._span
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None or (status is not None and status >= 500):
            from opentelemetry.trace import Status, StatusCode

            if error is not None:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error) if error else f"{status}"))
        span.end()


def open_tracing(endpoint: str | None, exporter: Any = None) -> Tracing | None:
    """The tracer for `--otlp-traces-endpoint` (None: not given, tracing off). `exporter`
    replaces the OTLP one (tests: the SDK's InMemorySpanExporter, spans exported as they
    end); the OTLP exporter batches them in a background thread."""
    if endpoint is None and exporter is None:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise TracingUnavailable(
            "--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'ppd[tracing]' (opentelemetry-sdk, opentelemetry-exporter-otlp)"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        assert endpoint is not None
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(endpoint)))
    return Tracing(provider, TraceContextTextMapPropagator())


def _otlp_exporter(endpoint: str) -> Any:
    """vLLM's choice of exporter: gRPC unless the protocol variable says http/protobuf."""
    protocol = os.environ.get(PROTOCOL_VARIABLE, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=endpoint)
    raise TracingUnavailable(f"{PROTOCOL_VARIABLE}={protocol!r} is not supported: use one of "
                             f"{', '.join(PROTOCOLS)}")
