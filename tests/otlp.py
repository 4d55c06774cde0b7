"""A real OTLP/HTTP collector stub for tests and benchmarks: an HTTP server on a thread that takes
`POST /v1/traces` (protobuf, as OpenTelemetry's HTTP exporter sends it), decodes the spans and
keeps them. Point a process at it with OTEL_EXPORTER_OTLP_ENDPOINT=collector.url."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Collector:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                collector._take(raw)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, raw: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(raw)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(Span(resource.get("service.name", ""), s.name, s.trace_id.hex(), s.span_id.hex(),
                                      s.parent_span_id.hex(), s.kind, {a.key: _value(a.value) for a in s.attributes}))
        with self._lock:
            self.spans += spans
            self.requests += 1

    def of_trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def __enter__(self) -> Collector:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
