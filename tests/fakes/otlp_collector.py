"""A fake OpenTelemetry collector: OTLP over HTTP (`POST /v1/traces`, protobuf), on loopback.

    with OtlpCollector() as collector:
        ... exporters send to collector.traces_url ...
        collector.spans()  # every span received: name, ids, service, attributes

What the proxy sends with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, and what vLLM's
nodes send with the same variable and `--otlp-traces-endpoint` (vllm/tracing/otel.py).
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    """One span as the collector received it (ids as integers, like the SDK's)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    service: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind is not None else None


class OtlpCollector:
    """Receives OTLP/HTTP trace exports in a background thread; `spans()` lists them."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                encoding = self.headers.get("content-encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                collector._receive(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.traces_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        span.name, int.from_bytes(span.trace_id, "big"),
                        int.from_bytes(span.span_id, "big"),
                        int.from_bytes(span.parent_span_id, "big") if span.parent_span_id
                        else None,
                        service, {a.key: _value(a.value) for a in span.attributes}))
        with self._lock:
            self._spans.extend(received)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            return list(self._spans)

    def __enter__(self) -> OtlpCollector:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
